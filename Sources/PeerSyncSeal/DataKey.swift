import Crypto
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity

// Sealed data for relays (issue 33; docs/PROTOCOL.md §20, docs/SECURITY.md "Relays"): what a
// device gives a relay is sealed under the group's current data key and signed by the writing
// device, so the relay stores and forwards blobs it cannot read, alter or attribute to another
// writer. Pure: formats, sealing and opening, no I/O.

/// A group's data key of one epoch: 32 random bytes for ChaCha20-Poly1305. A new epoch begins at
/// every removal (and on demand); each remaining device gets the key in a ``KeyEnvelope`` sealed
/// to its device key, so a removed device never learns a later key.
package struct DataKey: Sendable, Equatable {
    /// The epoch this key seals (0 for a group's first).
    public let epoch: UInt64
    /// The key's 32 bytes.
    public let bytes: [UInt8]

    public init?(epoch: UInt64, bytes: [UInt8]) {
        guard bytes.count == 32 else { return nil }
        self.epoch = epoch
        self.bytes = bytes
    }

    /// A new random key for `epoch`.
    public static func generate(epoch: UInt64) -> DataKey {
        DataKey(epoch: epoch, bytes: SymmetricKey(size: .bits256).withUnsafeBytes { Array($0) })!
    }

    var symmetric: SymmetricKey { SymmetricKey(data: bytes) }

    /// The key's name in blob headers: the first 8 bytes of SHA-256("peersync data key id v1" 00
    /// ‖ key). Two admins that start the same epoch concurrently make two keys; a blob names the
    /// one it was sealed with, and a reader finds it among the envelopes it can open. Says
    /// nothing about the key.
    public var id: [UInt8] { Array(SHA256.hash(data: Array("peersync data key id v1".utf8) + [0] + bytes).prefix(8)) }
}

/// Why sealed data was refused. One line each.
package enum SealError: Error, Equatable, CustomStringConvertible {
    /// The bytes do not parse as the format (truncated, wrong version, trailing bytes).
    case malformed(String)
    /// The signature does not verify with the writer's (or sender's) key.
    case badSignature(String)
    /// The ciphertext does not open with the key (tampered, or sealed for another group or epoch).
    case cannotOpen(String)
    /// An envelope for another device, or a blob of another group.
    case notForThis(String)

    public var description: String {
        switch self {
        case .malformed(let what): "malformed sealed data: \(what)"
        case .badSignature(let what): "sealed data refused: \(what)"
        case .cannotOpen(let what): "sealed data does not open: \(what)"
        case .notForThis(let what): "sealed data refused: \(what)"
        }
    }
}

/// Appends bytes in the formats' byte order.
package struct SealWriter {
    package init() {}
    package var bytes: [UInt8] = []

    package mutating func byte(_ value: UInt8) { bytes.append(value) }
    package mutating func varint(_ value: UInt64) { Varint.append(value, to: &bytes) }
    package mutating func raw(_ value: some Sequence<UInt8>) { bytes.append(contentsOf: value) }
    package mutating func lengthPrefixed(_ value: [UInt8]) {
        varint(UInt64(value.count))
        raw(value)
    }
}

/// Reads the formats' fields, failing with ``SealError/malformed(_:)``.
package struct SealReader {
    var reader: ByteReader
    let what: String

    package init(_ bytes: [UInt8], what: String) {
        reader = ByteReader(bytes)
        self.what = what
    }

    package mutating func byte(_ field: String) throws(SealError) -> UInt8 {
        guard let value = reader.readByte() else { throw .malformed("\(what): truncated at \(field)") }
        return value
    }

    package mutating func varint(_ field: String) throws(SealError) -> UInt64 {
        let start = reader.offset
        guard let value = reader.readVarint() else { throw .malformed("\(what): truncated \(field)") }
        guard reader.offset - start == Varint.size(of: value) else { throw .malformed("\(what): \(field) is not minimally encoded") }
        return value
    }

    package mutating func raw(_ count: Int, _ field: String) throws(SealError) -> [UInt8] {
        guard let value = reader.readBytes(count) else { throw .malformed("\(what): truncated \(field)") }
        return Array(value)
    }

    package mutating func lengthPrefixed(_ field: String, max: Int) throws(SealError) -> [UInt8] {
        let count = try varint(field + " length")
        guard count <= UInt64(max) else { throw .malformed("\(what): \(field) of \(count) bytes (at most \(max))") }
        return try raw(Int(count), field)
    }

    package var offset: Int { reader.offset }
    package var isAtEnd: Bool { reader.isAtEnd }
}
