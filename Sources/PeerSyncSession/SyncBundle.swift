import Crypto
import PeerSyncCRDT
import PeerSyncWire

/// Sync without a network: exactly what another device lacks, in a file carried on a USB stick
/// or sent by mail, encrypted and authenticated for the group (docs/PROTOCOL.md §11).
///
/// ```
/// bundle  = "PSBUNDLE" u8(1) varint(n) header(n bytes) nonce(12) ciphertext tag(16)
/// header  = fields: 1 groupTag (string), 2 sender (bytes16), 3 senderName (string),
///           4 createdAt (varint, ms since 1970), 5 records (varint)
/// plaintext = a general-form delta (§5.2), fresh dictionary, last_physical = createdAt
/// AEAD    = ChaCha20-Poly1305, key HKDF(secret, "peersync v1", "bundle key", 32),
///           additional data = every byte before the nonce
/// ```
/// A device's context file (`--for`) says what it has:
/// ```
/// context = "PSCONTEXT" u8(1) varint(n) body(n bytes: fields 1 groupTag, 2 replica (bytes16),
///           3 context (context blob, §6.2)) HMAC-SHA256(same key, every byte before it)
/// ```
public enum SyncBundle {
    static let magic = Array("PSBUNDLE".utf8)
    static let contextMagic = Array("PSCONTEXT".utf8)
    static let version: UInt8 = 1

    /// Who made a bundle, when, for which group.
    public struct Header: Sendable, Equatable {
        public var groupTag: String
        public var sender: ReplicaID
        public var senderName: String
        /// Wall-clock milliseconds since 1970 when it was made.
        public var createdAt: UInt64
        /// Records in the bundle.
        public var records: UInt64

        public init(groupTag: String, sender: ReplicaID, senderName: String, createdAt: UInt64, records: UInt64) {
            self.groupTag = groupTag
            self.sender = sender
            self.senderName = senderName
            self.createdAt = createdAt
            self.records = records
        }
    }

    /// The bundle bytes for `delta` (what the receiver lacks, with the sender's context).
    public static func seal(_ delta: RecordMap, header: Header, secret: GroupSecret) -> [UInt8] {
        var fields = FieldWriter()
        fields.string(1, header.groupTag)
        fields.bytes(2, header.sender.bigEndianBytes)
        fields.string(3, header.senderName)
        fields.varint(4, header.createdAt)
        fields.varint(5, header.records)
        var out = magic + [version]
        Varint.append(UInt64(fields.bytes.count), to: &out)
        out += fields.bytes
        let plaintext = WireDelta.encode(records: delta.allRecords, context: delta.context,
                                         with: WireDictionary(startingAt: header.createdAt))
        // The nonce is random: two bundles never share one under the group's key.
        let sealed = try! ChaChaPoly.seal(plaintext, using: key(secret), nonce: ChaChaPoly.Nonce(), authenticating: out)
        return out + Array(sealed.combined)
    }

    /// Checks and decrypts a bundle of this group.
    ///
    /// - Throws: ``BundleError`` — not a bundle, a newer format, another group, tampered with or
    ///   corrupt, or a malformed delta inside.
    public static func open(_ bytes: [UInt8], secret: GroupSecret) throws(BundleError) -> (Header, RecordMap) {
        var reader = ByteReader(bytes)
        let body = try framed(&reader, magic: magic, what: "sync bundle")
        let header: Header
        do {
            let f = try FieldReader(message: "bundle header", body: body)
            guard let sender = ReplicaID(bigEndianBytes: try f.bytes(2, "sender")) else { throw BundleError.malformed("sender ID") }
            header = Header(groupTag: try f.string(1, "groupTag"), sender: sender, senderName: try f.string(3, "senderName"),
                            createdAt: try f.varint(4, "createdAt"), records: try f.varint(5, "records"))
        } catch let error as BundleError {
            throw error
        } catch {
            throw .malformed("header: \(error)")
        }
        guard header.groupTag == secret.groupTag else { throw .otherGroup }
        let authenticated = Array(bytes[..<reader.offset])
        let plaintext: [UInt8]
        do {
            let box = try ChaChaPoly.SealedBox(combined: bytes[reader.offset...])
            plaintext = Array(try ChaChaPoly.open(box, using: key(secret), authenticating: authenticated))
        } catch {
            throw .tampered
        }
        do {
            return (header, try WireDelta.decode(plaintext, with: WireDictionary(startingAt: header.createdAt)))
        } catch {
            throw .malformed("delta: \(error)")
        }
    }

    /// A device's context as a file, for `bundle create --for` on another device.
    public static func sealContext(_ context: CausalContext, replica: ReplicaID, secret: GroupSecret) -> [UInt8] {
        var fields = FieldWriter()
        fields.string(1, secret.groupTag)
        fields.bytes(2, replica.bigEndianBytes)
        fields.bytes(3, context.encodedBlob())
        var out = contextMagic + [version]
        Varint.append(UInt64(fields.bytes.count), to: &out)
        out += fields.bytes
        return out + Array(HMAC<SHA256>.authenticationCode(for: out, using: key(secret)))
    }

    /// Reads a context file of this group.
    public static func openContext(_ bytes: [UInt8], secret: GroupSecret) throws(BundleError) -> (ReplicaID, CausalContext) {
        var reader = ByteReader(bytes)
        let body = try framed(&reader, magic: contextMagic, what: "context file")
        guard reader.remaining == 32 else { throw .tampered }
        let signed = Array(bytes[..<reader.offset])
        guard HMAC<SHA256>.isValidAuthenticationCode(Array(bytes[reader.offset...]), authenticating: signed, using: key(secret)) else {
            if let f = try? FieldReader(message: "context", body: body), let tag = try? f.string(1, "groupTag"), tag != secret.groupTag {
                throw .otherGroup
            }
            throw .tampered
        }
        do {
            let f = try FieldReader(message: "context", body: body)
            guard let replica = ReplicaID(bigEndianBytes: try f.bytes(2, "replica")) else { throw BundleError.malformed("replica ID") }
            return (replica, try CausalContext(blob: try f.bytes(3, "context")))
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

    private static func key(_ secret: GroupSecret) -> SymmetricKey {
        SymmetricKey(data: secret.derive("bundle key", count: 32))
    }
}

/// Why a bundle or context file is refused. Nothing of it is applied.
public enum BundleError: Error, Sendable, Equatable, CustomStringConvertible {
    case notABundle(String)
    case unsupportedVersion(UInt8)
    case otherGroup
    case tampered
    case malformed(String)
    /// It decrypted but failed a check a peer's delta must pass.
    case refused(String)

    public var description: String {
        switch self {
        case .notABundle(let what): "not a PeerSync \(what)"
        case .unsupportedVersion(let v): "made by a newer PeerSync (format \(v)); upgrade this one"
        case .otherGroup: "made for another sync group"
        case .tampered: "it was changed after it was made, or it is corrupt (authentication failed)"
        case .malformed(let detail): "malformed: \(detail)"
        case .refused(let detail): "refused: \(detail)"
        }
    }
}
