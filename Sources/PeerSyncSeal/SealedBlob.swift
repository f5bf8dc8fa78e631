import Crypto
import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity

/// What a relay stores: some of one writer's events, or a snapshot, sealed under the group's
/// data key of an epoch and signed by the writing device (docs/PROTOCOL.md §20.1):
///
/// ```
/// blob       = header varint(len) ciphertext signature
/// header     = u8(format = 1) u8(kind) bytes16(group ID) varint(epoch) bytes8(key ID)
///              bytes20(writer device ID) bytes16(replica ID) varint(first counter)
///              varint(last counter) varint(head) bytes12(nonce)
///              [kind 2: varint(#) (bytes16(replica ID) varint(counter))…]
/// kind       = 1: the writer's events first…last of that replica; 2: a snapshot of the whole
///              state, covering the version vector that follows (the relay may drop every blob
///              it covers)
/// head       = the writer's highest counter of that replica when it sealed (so a reader sees a
///              gap the relay does not fill)
/// ciphertext = ChaCha20-Poly1305(data key of epoch, nonce, plaintext, aad = header) ‖ tag16
/// signature  = bytes64: ECDSA P-256 low-S by the writer's device key over
///              "peersync sealed blob v1" 00 ‖ header ‖ varint(len) ‖ ciphertext
/// ```
/// The header is what a relay may read: group, epoch, writer, replica, counters and sizes —
/// never record IDs, collections, field names, values or device names (they are in the
/// ciphertext). The AAD binds the ciphertext to its header: moved to another group, writer,
/// epoch or counter range it does not open; the signature binds both to the writer.
package struct SealedBlob: Sendable, Equatable {
    package enum Kind: UInt8, Sendable {
        case writes = 1
        case snapshot = 2
    }

    public let kind: Kind
    public let groupID: GroupID
    public let epoch: UInt64
    /// The data key's ID (``DataKey/id``).
    public let keyID: [UInt8]
    public let writer: DeviceID
    public let replica: ReplicaID
    public let firstCounter: UInt64
    public let lastCounter: UInt64
    public let head: UInt64
    let nonce: [UInt8]
    /// For a snapshot: the version vector it covers.
    public let covers: [ReplicaID: UInt64]
    let ciphertext: [UInt8]
    public let signature: [UInt8]

    static let format: UInt8 = 1
    static let signingDomain = Array("peersync sealed blob v1".utf8) + [0]
    /// Largest ciphertext a blob may hold (a relay refuses larger ones; PROTOCOL §20.1).
    public static let maxCiphertextBytes = 16 << 20
    static let maxCoveredReplicas = ValidationLimits.maxContextReplicas

    /// Seals `plaintext` (a delta: what the writer wrote as `replica`, counters `counters`) for
    /// `group` under `key`, signed by `writer`. `nonce`: 12 bytes, never reused with one key
    /// (random by default; fixed only for test vectors).
    public static func seal(_ plaintext: [UInt8], kind: Kind = .writes, group: GroupID, key: DataKey, writer: DeviceKey,
                            replica: ReplicaID, counters: ClosedRange<UInt64>, head: UInt64, covers: [ReplicaID: UInt64] = [:],
                            nonce: [UInt8]? = nil) throws -> SealedBlob {
        let nonce = nonce ?? ChaChaPoly.Nonce().withUnsafeBytes { Array($0) }
        var blob = SealedBlob(kind: kind, groupID: group, epoch: key.epoch, keyID: key.id, writer: writer.deviceID, replica: replica,
                              firstCounter: counters.lowerBound, lastCounter: counters.upperBound, head: head, nonce: nonce,
                              covers: kind == .snapshot ? covers : [:], ciphertext: [], signature: [])
        let sealed = try ChaChaPoly.seal(plaintext, using: key.symmetric, nonce: try ChaChaPoly.Nonce(data: nonce),
                                         authenticating: blob.header)
        blob = SealedBlob(kind: blob.kind, groupID: group, epoch: key.epoch, keyID: key.id, writer: writer.deviceID, replica: replica,
                          firstCounter: blob.firstCounter, lastCounter: blob.lastCounter, head: head, nonce: nonce, covers: blob.covers,
                          ciphertext: Array(sealed.ciphertext) + Array(sealed.tag), signature: [])
        return SealedBlob(kind: blob.kind, groupID: group, epoch: key.epoch, keyID: key.id, writer: writer.deviceID, replica: replica,
                          firstCounter: blob.firstCounter, lastCounter: blob.lastCounter, head: head, nonce: nonce, covers: blob.covers,
                          ciphertext: blob.ciphertext, signature: writer.signature(for: blob.signed))
    }

    var header: [UInt8] {
        var writer = SealWriter()
        writer.byte(Self.format)
        writer.byte(kind.rawValue)
        writer.raw(groupID.bytes)
        writer.varint(epoch)
        writer.raw(keyID)
        writer.raw(self.writer.bytes)
        writer.raw(replica.bigEndianBytes)
        writer.varint(firstCounter)
        writer.varint(lastCounter)
        writer.varint(head)
        writer.raw(nonce)
        if kind == .snapshot {
            writer.varint(UInt64(covers.count))
            for (replica, counter) in covers.sorted(by: { $0.key.bigEndianBytes.lexicographicallyPrecedes($1.key.bigEndianBytes) }) {
                writer.raw(replica.bigEndianBytes)
                writer.varint(counter)
            }
        }
        return writer.bytes
    }

    /// What the signature signs (without the domain).
    private var signedPart: [UInt8] {
        var writer = SealWriter()
        writer.raw(header)
        writer.lengthPrefixed(ciphertext)
        return writer.bytes
    }

    var signed: [UInt8] { Self.signingDomain + signedPart }

    /// The blob's bytes.
    public var bytes: [UInt8] { signedPart + signature }

    /// Bytes the relay stores for it.
    public var size: Int { bytes.count }

    /// Parses a blob and checks its form (not its signature: ``isSigned(by:)``).
    public init(bytes: [UInt8]) throws(SealError) {
        var reader = SealReader(bytes, what: "sealed blob")
        guard try reader.byte("format") == Self.format else { throw .malformed("sealed blob: unknown format") }
        guard let kind = Kind(rawValue: try reader.byte("kind")) else { throw .malformed("sealed blob: unknown kind") }
        self.kind = kind
        groupID = GroupID(bytes: try reader.raw(16, "group ID"))!
        epoch = try reader.varint("epoch")
        keyID = try reader.raw(8, "key ID")
        writer = DeviceID(bytes: try reader.raw(20, "writer"))!
        replica = ReplicaID(bigEndianBytes: try reader.raw(16, "replica ID"))!
        firstCounter = try reader.varint("first counter")
        lastCounter = try reader.varint("last counter")
        head = try reader.varint("head")
        guard firstCounter >= 1, firstCounter <= lastCounter, lastCounter <= head else {
            throw .malformed("sealed blob: counters \(firstCounter)…\(lastCounter) with head \(head)")
        }
        nonce = try reader.raw(12, "nonce")
        var covers: [ReplicaID: UInt64] = [:]
        if kind == .snapshot {
            let count = try reader.varint("covered replicas")
            guard count <= UInt64(Self.maxCoveredReplicas) else { throw .malformed("sealed blob: covers \(count) replicas") }
            var previous: [UInt8]?
            for _ in 0..<count {
                let id = try reader.raw(16, "covered replica")
                if let previous, !previous.lexicographicallyPrecedes(id) { throw .malformed("sealed blob: covered replicas not ascending") }
                previous = id
                covers[ReplicaID(bigEndianBytes: id)!] = try reader.varint("covered counter")
            }
        }
        self.covers = covers
        ciphertext = try reader.lengthPrefixed("ciphertext", max: Self.maxCiphertextBytes)
        guard ciphertext.count >= 16 else { throw .malformed("sealed blob: ciphertext shorter than its tag") }
        signature = try reader.raw(64, "signature")
        guard reader.isAtEnd else { throw .malformed("sealed blob: trailing bytes") }
    }

    init(kind: Kind, groupID: GroupID, epoch: UInt64, keyID: [UInt8], writer: DeviceID, replica: ReplicaID, firstCounter: UInt64,
         lastCounter: UInt64, head: UInt64, nonce: [UInt8], covers: [ReplicaID: UInt64], ciphertext: [UInt8], signature: [UInt8]) {
        self.kind = kind
        self.groupID = groupID
        self.epoch = epoch
        self.keyID = keyID
        self.writer = writer
        self.replica = replica
        self.firstCounter = firstCounter
        self.lastCounter = lastCounter
        self.head = head
        self.nonce = nonce
        self.covers = covers
        self.ciphertext = ciphertext
        self.signature = signature
    }

    /// Whether `writerKey` (the key of ``writer``) signed this blob.
    public func isSigned(by writerKey: DevicePublicKey) -> Bool {
        writerKey.deviceID == writer && writerKey.isValidSignature(signature, for: signed)
    }

    /// The plaintext, opened with the group's data key of this blob's epoch. Check the group
    /// (``groupID``), the signature (``isSigned(by:)``) and that the roster lets the writer write
    /// as ``replica`` first.
    public func open(with key: DataKey, group: GroupID) throws(SealError) -> [UInt8] {
        guard group == groupID else { throw .notForThis("a blob of another group") }
        guard key.epoch == epoch, key.id == keyID else {
            throw .cannotOpen("the blob is sealed with key \(hex(keyID)) of epoch \(epoch), not key \(hex(key.id)) of epoch \(key.epoch)")
        }
        do {
            let box = try ChaChaPoly.SealedBox(nonce: ChaChaPoly.Nonce(data: nonce), ciphertext: ciphertext.dropLast(16),
                                               tag: ciphertext.suffix(16))
            return Array(try ChaChaPoly.open(box, using: key.symmetric, authenticating: header))
        } catch {
            throw .cannotOpen("the blob does not open with the epoch's key (altered, or sealed for another header)")
        }
    }
}

/// Lowercase hex, for messages.
func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }
