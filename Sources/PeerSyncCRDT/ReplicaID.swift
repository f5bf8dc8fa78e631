/// The identity of one replica: 128 random bits, created once per store and never reused.
///
/// Replica IDs order totally (by `high`, then `low`); that order breaks ties between writes
/// with equal hybrid timestamps and picks which side dials when two peers meet.
public struct ReplicaID: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// The first 64 bits.
    public let high: UInt64
    /// The last 64 bits.
    public let low: UInt64

    public init(high: UInt64, low: UInt64) {
        self.high = high
        self.low = low
    }

    /// A new replica ID from the system's secure random source.
    public static func random() -> ReplicaID {
        var generator = SystemRandomNumberGenerator()
        return random(using: &generator)
    }

    /// A new replica ID from `generator` (tests pass a seeded generator).
    public static func random<G: RandomNumberGenerator>(using generator: inout G) -> ReplicaID {
        ReplicaID(high: generator.next(), low: generator.next())
    }

    /// Parses the 32-digit hexadecimal form that ``description`` prints.
    public init?(hex: String) {
        let utf8 = Array(hex.utf8)
        guard utf8.count == 32,
              let high = UInt64(String(decoding: utf8[0..<16], as: UTF8.self), radix: 16),
              let low = UInt64(String(decoding: utf8[16..<32], as: UTF8.self), radix: 16)
        else { return nil }
        self.init(high: high, low: low)
    }

    /// The 16-byte form used on disk and on the wire: `high`, then `low`, each big-endian.
    public var bigEndianBytes: [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(16)
        appendBigEndianBytes(to: &out)
        return out
    }

    /// Appends ``bigEndianBytes`` to `out`.
    public func appendBigEndianBytes(to out: inout [UInt8]) {
        withUnsafeBytes(of: (high.bigEndian, low.bigEndian)) { out.append(contentsOf: $0) }
    }

    /// Reads the 16-byte form; nil unless `bytes` holds exactly 16 bytes.
    ///
    /// Inlinable, so that callers in other modules (the wire decoder reads one per replica
    /// reference) get a specialized copy instead of a generic one (about 10 times slower).
    @inlinable
    public init?<C: Collection<UInt8>>(bigEndianBytes bytes: C) {
        guard bytes.count == 16 else { return nil }
        var high: UInt64 = 0
        var low: UInt64 = 0
        var index = bytes.startIndex
        for _ in 0..<8 {
            high = high << 8 | UInt64(bytes[index])
            bytes.formIndex(after: &index)
        }
        for _ in 0..<8 {
            low = low << 8 | UInt64(bytes[index])
            bytes.formIndex(after: &index)
        }
        self.init(high: high, low: low)
    }

    /// 32 lowercase hexadecimal digits.
    public var description: String {
        hex16(high) + hex16(low)
    }

    /// The first 8 hexadecimal digits, for logs and tables.
    public var shortDescription: String {
        String(description.prefix(8))
    }

    public static func < (lhs: ReplicaID, rhs: ReplicaID) -> Bool {
        (lhs.high, lhs.low) < (rhs.high, rhs.low)
    }
}

extension ReplicaID: Codable {
    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        let text = try container.decode(String.self)
        guard let id = ReplicaID(hex: text) else {
            throw DecodingError.dataCorruptedError(
                in: container, debugDescription: "replica ID must be 32 hexadecimal digits, got \(text)")
        }
        self = id
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(description)
    }
}

@inline(__always)
func hex16(_ value: UInt64) -> String {
    let digits = String(value, radix: 16)
    return String(repeating: "0", count: 16 - digits.count) + digits
}
