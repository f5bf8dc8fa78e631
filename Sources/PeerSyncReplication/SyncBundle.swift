import Crypto
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncWire

/// Sync without a network: exactly what another device lacks, in a file carried on a USB stick
/// or sent by mail — encrypted for chosen devices of the group and signed by the device that
/// made it (docs/PROTOCOL.md §11).
///
/// ```
/// bundle     = "PSBUNDLE" u8(2) varint(n) header(n bytes) signature(64)
/// header     = fields: 1 group (bytes16), 2 sender key (bytes65), 3 sender replica (bytes16),
///              4 senderName (string), 5 createdAt (varint ms), 6 records (varint),
///              7 ephemeral key (bytes65), 8 recipients (bytes: (device ID 20 ‖ wrapped key 60)…),
///              9 payload (bytes: nonce 12 ‖ ciphertext ‖ tag 16)
/// payload    = ChaCha20-Poly1305 under a random content key K of a general-form delta (§5.2,
///              fresh dictionary, last_physical = createdAt); additional data = the group ID
/// wrapped    = ChaCha20-Poly1305 (nonce 12 ‖ K encrypted 32 ‖ tag 16) under
///              HKDF-SHA256(ECDH(ephemeral, recipient key), salt "peersync bundle v2",
///                          info recipient device ID ‖ ephemeral key, 32 bytes)
/// signature  = the sender's device key, ECDSA P-256 low-S over "peersync bundle v2" 00 ‖ every byte before it
/// ```
/// A device's context file (for `--for`) says what it has, signed by it:
/// ```
/// context = "PSCONTEXT" u8(2) varint(n) body(n bytes: fields 1 group (bytes16), 2 replica (bytes16),
///           3 device key (bytes65), 4 context (context blob, §6.2)) signature(64, over "peersync context v2" 00 ‖ the rest)
/// ```
/// What a device has, as its signed context file says: the device and its causal context.
package struct BundleContext: Sendable, Equatable {
    /// The device that made the context file (bundles for it are encrypted to this key).
    public var device: DevicePublicKey
    /// Everything that device had seen when it wrote the file.
    public var context: CausalContext

    public init(device: DevicePublicKey, context: CausalContext) {
        self.device = device
        self.context = context
    }
}

package enum SyncBundle {
    static let magic = Array("PSBUNDLE".utf8)
    static let contextMagic = Array("PSCONTEXT".utf8)
    static let version: UInt8 = 2
    static let bundleDomain = Array("peersync bundle v2".utf8) + [0]
    static let contextDomain = Array("peersync context v2".utf8) + [0]

    /// Who made a bundle, when, for which group.
    package struct Header: Sendable, Equatable {
        public var groupID: GroupID
        public var sender: DevicePublicKey
        public var senderReplica: ReplicaID
        public var senderName: String
        /// Wall-clock milliseconds since 1970 when it was made.
        public var createdAt: UInt64
        /// Records in the bundle.
        public var records: UInt64

        public init(groupID: GroupID, sender: DevicePublicKey, senderReplica: ReplicaID, senderName: String, createdAt: UInt64,
                    records: UInt64) {
            self.groupID = groupID
            self.sender = sender
            self.senderReplica = senderReplica
            self.senderName = senderName
            self.createdAt = createdAt
            self.records = records
        }
    }

    /// The bundle bytes for `delta`, readable by `recipients` only, signed with `senderKey`.
    public static func seal(_ delta: RecordMap, header: Header, senderKey: DeviceKey, recipients: [DevicePublicKey]) -> [UInt8] {
        let contentKey = SymmetricKey(size: .bits256)
        let plaintext = WireDelta.encode(records: delta.allRecords, context: delta.context,
                                         with: WireDictionary(startingAt: header.createdAt))
        let payload = try! ChaChaPoly.seal(plaintext, using: contentKey, authenticating: header.groupID.bytes).combined
        let ephemeral = P256.KeyAgreement.PrivateKey()
        let ephemeralKey = Array(ephemeral.publicKey.x963Representation)
        var wrapped: [UInt8] = []
        for recipient in Set(recipients.map(\.x963)).sorted(by: { $0.lexicographicallyPrecedes($1) }) {
            guard let key = try? P256.KeyAgreement.PublicKey(x963Representation: recipient),
                  let shared = try? ephemeral.sharedSecretFromKeyAgreement(with: key) else { continue }
            let device = DevicePublicKey(x963: recipient)!.deviceID
            let wrapKey = shared.hkdfDerivedSymmetricKey(using: SHA256.self, salt: Array("peersync bundle v2".utf8),
                                                         sharedInfo: device.bytes + ephemeralKey, outputByteCount: 32)
            let box = try! ChaChaPoly.seal(contentKey.withUnsafeBytes { Array($0) }, using: wrapKey)
            wrapped += device.bytes + Array(box.combined)
        }
        var fields = FieldWriter()
        fields.bytes(1, header.groupID.bytes)
        fields.bytes(2, header.sender.x963)
        fields.bytes(3, header.senderReplica.bigEndianBytes)
        fields.string(4, header.senderName)
        fields.varint(5, header.createdAt)
        fields.varint(6, header.records)
        fields.bytes(7, ephemeralKey)
        fields.bytes(8, wrapped)
        fields.bytes(9, Array(payload))
        var out = magic + [version]
        Varint.append(UInt64(fields.bytes.count), to: &out)
        out += fields.bytes
        return out + senderKey.signature(for: bundleDomain + out)
    }

    /// Checks the signature and decrypts a bundle for `me` in group `groupID`. Whether its sender
    /// may send this device data is the caller's question (its roster, with the bundle's own
    /// roster entries: a joiner's bundle carries its enrol).
    ///
    /// - Throws: ``BundleError`` — not a bundle, a newer format, another group, not for this
    ///   device, tampered with or corrupt, malformed inside.
    public static func open(_ bytes: [UInt8], groupID: GroupID, me: DeviceKey) throws(BundleError) -> (Header, RecordMap) {
        var reader = ByteReader(bytes)
        let body = try framed(&reader, magic: magic, what: "sync bundle")
        let signed = Array(bytes[..<reader.offset])
        guard reader.remaining == 64 else { throw .tampered }
        let f: FieldReader
        do { f = try FieldReader(message: "bundle", body: body) } catch { throw .malformed("header: \(error)") }
        guard let group = f.blobs[1].flatMap(GroupID.init(bytes:)) else { throw .malformed("group ID") }
        guard group == groupID else { throw .otherGroup }
        guard let sender = f.blobs[2].flatMap(DevicePublicKey.init(x963:)) else { throw .malformed("sender key") }
        guard sender.isValidSignature(Array(bytes[reader.offset...]), for: bundleDomain + signed) else { throw .tampered }
        guard let replicaBytes = f.blobs[3], let replica = ReplicaID(bigEndianBytes: replicaBytes),
              let nameBytes = f.blobs[4], let name = String(validating: nameBytes, as: UTF8.self),
              let createdAt = f.varints[5], let records = f.varints[6],
              let ephemeralKey = f.blobs[7], let wrapped = f.blobs[8], let payload = f.blobs[9],
              let ephemeral = try? P256.KeyAgreement.PublicKey(x963Representation: ephemeralKey) else {
            throw .malformed("header fields")
        }
        let header = Header(groupID: group, sender: sender, senderReplica: replica, senderName: name, createdAt: createdAt,
                            records: records)
        guard wrapped.count % 80 == 0 else { throw .malformed("recipient list") }
        var contentKey: SymmetricKey?
        for start in stride(from: 0, to: wrapped.count, by: 80) where Array(wrapped[start..<(start + 20)]) == me.deviceID.bytes {
            let agreement = try? P256.KeyAgreement.PrivateKey(rawRepresentation: me.privateKey.rawRepresentation)
            guard let shared = try? agreement?.sharedSecretFromKeyAgreement(with: ephemeral) else { throw .tampered }
            let wrapKey = shared.hkdfDerivedSymmetricKey(using: SHA256.self, salt: Array("peersync bundle v2".utf8),
                                                         sharedInfo: me.deviceID.bytes + ephemeralKey, outputByteCount: 32)
            guard let box = try? ChaChaPoly.SealedBox(combined: wrapped[(start + 20)..<(start + 80)]),
                  let key = try? ChaChaPoly.open(box, using: wrapKey) else { throw .tampered }
            contentKey = SymmetricKey(data: key)
        }
        guard let contentKey else { throw .notForThisDevice }
        let plaintext: [UInt8]
        do {
            plaintext = Array(try ChaChaPoly.open(try ChaChaPoly.SealedBox(combined: payload), using: contentKey,
                                                  authenticating: group.bytes))
        } catch {
            throw .tampered
        }
        do {
            return (header, try WireDelta.decode(plaintext, with: WireDictionary(startingAt: createdAt)))
        } catch {
            throw .malformed("delta: \(error)")
        }
    }

    /// A device's context as a file, signed by it, for `bundle create --for` on another device.
    public static func sealContext(_ context: CausalContext, replica: ReplicaID, groupID: GroupID, key: DeviceKey) -> [UInt8] {
        var fields = FieldWriter()
        fields.bytes(1, groupID.bytes)
        fields.bytes(2, replica.bigEndianBytes)
        fields.bytes(3, key.publicKey.x963)
        fields.bytes(4, context.encodedBlob())
        var out = contextMagic + [version]
        Varint.append(UInt64(fields.bytes.count), to: &out)
        out += fields.bytes
        return out + key.signature(for: contextDomain + out)
    }

    /// Reads a context file of group `groupID`: the device it is from and what it has.
    public static func openContext(_ bytes: [UInt8], groupID: GroupID) throws(BundleError) -> BundleContext {
        var reader = ByteReader(bytes)
        let body = try framed(&reader, magic: contextMagic, what: "context file")
        let signed = Array(bytes[..<reader.offset])
        guard reader.remaining == 64 else { throw .tampered }
        do {
            let f = try FieldReader(message: "context", body: body)
            guard GroupID(bytes: try f.bytes(1, "group")) == groupID else { throw BundleError.otherGroup }
            guard let key = DevicePublicKey(x963: try f.bytes(3, "device key")) else { throw BundleError.malformed("device key") }
            guard key.isValidSignature(Array(bytes[reader.offset...]), for: contextDomain + signed) else { throw BundleError.tampered }
            return BundleContext(device: key, context: try CausalContext(blob: try f.bytes(4, "context")))
        } catch let error as BundleError {
            throw error
        } catch {
            throw .malformed("context: \(error)")
        }
    }

    private static func framed(_ reader: inout ByteReader, magic: [UInt8], what: String) throws(BundleError) -> [UInt8] {
        guard let start = reader.readBytes(magic.count), Array(start) == magic else { throw .notABundle(what) }
        guard let version = reader.readByte() else { throw .malformed("truncated") }
        guard version == Self.version else { throw .unsupportedVersion(version) }
        guard let length = reader.readVarint(), length <= UInt64(reader.remaining), let body = reader.readBytes(Int(length)) else {
            throw .malformed("truncated header")
        }
        return Array(body)
    }
}

/// Why a bundle or context file is refused. Nothing of it is applied.
package enum BundleError: Error, Sendable, Equatable, CustomStringConvertible {
    case notABundle(String)
    case unsupportedVersion(UInt8)
    case otherGroup
    case notForThisDevice
    case unknownSender(String)
    /// This device has not joined yet, so it knows no member to encrypt for.
    case notJoined
    case tampered
    case malformed(String)
    /// It decrypted but failed a check a peer's delta must pass.
    case refused(String)

    public var description: String {
        switch self {
        case .notABundle(let what): "not a PeerSync \(what)"
        case .unsupportedVersion(let v): "made by another PeerSync version (format \(v)); this one reads format \(SyncBundle.version)"
        case .otherGroup: "made for another sync group"
        case .notForThisDevice: "not encrypted for this device (make it with --all, or --for this device's context file)"
        case .unknownSender(let id): "made by device \(id), which is not an active member of this group"
        case .notJoined: "this device has not joined its group yet, so it knows no member to encrypt for: apply a bundle from its inviter first, or use --for with a member's context file"
        case .tampered: "it was changed after it was made, or it is corrupt (authentication failed)"
        case .malformed(let detail): "malformed: \(detail)"
        case .refused(let detail): "refused: \(detail)"
        }
    }
}
