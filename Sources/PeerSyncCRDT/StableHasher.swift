/// SipHash-2-4 with a 128-bit result and a fixed key (Aumasson & Bernstein, 2012).
///
/// Unlike Swift's `Hasher`, which is seeded per process, this gives the same value on every
/// replica and every run, so it can name state across machines (``StateDigest``).
/// It is not a MAC here: the key is public. Input is fed as whole 64-bit words and byte runs.
package struct StableHasher: Sendable {
    private var v0: UInt64 = 0x736f_6d65_7073_6575 ^ 0x5065_6572_5379_6e63 // "PeerSync"
    private var v1: UInt64 = 0x646f_7261_6e64_6f6d ^ 0x2d64_6967_6573_7431 ^ 0xee
    private var v2: UInt64 = 0x6c79_6765_6e65_7261 ^ 0x5065_6572_5379_6e63
    private var v3: UInt64 = 0x7465_6462_7974_6573 ^ 0x2d64_6967_6573_7431
    private var tail: UInt64 = 0
    private var tailCount: Int = 0
    private var length: UInt64 = 0

    public init() {}

    @inline(__always)
    private static func rotl(_ x: UInt64, _ b: UInt64) -> UInt64 { (x << b) | (x >> (64 &- b)) }

    @inline(__always)
    private mutating func round() {
        v0 = v0 &+ v1; v1 = Self.rotl(v1, 13); v1 ^= v0; v0 = Self.rotl(v0, 32)
        v2 = v2 &+ v3; v3 = Self.rotl(v3, 16); v3 ^= v2
        v0 = v0 &+ v3; v3 = Self.rotl(v3, 21); v3 ^= v0
        v2 = v2 &+ v1; v1 = Self.rotl(v1, 17); v1 ^= v2; v2 = Self.rotl(v2, 32)
    }

    @inline(__always)
    private mutating func compress(_ m: UInt64) {
        v3 ^= m
        round(); round()
        v0 ^= m
    }

    /// Feeds one byte.
    @inline(__always)
    public mutating func combine(_ byte: UInt8) {
        tail |= UInt64(byte) << (UInt64(tailCount) * 8)
        tailCount += 1
        length &+= 1
        if tailCount == 8 {
            compress(tail)
            tail = 0
            tailCount = 0
        }
    }

    /// Feeds 8 bytes, little-endian.
    @inline(__always)
    public mutating func combine(_ word: UInt64) {
        length &+= 8
        if tailCount == 0 {
            compress(word)
        } else {
            // The pending bytes and the word's low bytes make one message word; the word's
            // high bytes become the new tail (the same stream as eight single bytes).
            let shift = UInt64(tailCount) * 8
            compress(tail | (word << shift))
            tail = word >> (64 &- shift)
        }
    }

    /// Feeds a byte count and then the bytes, so that adjacent strings cannot run together.
    public mutating func combine<C: Collection>(lengthPrefixed bytes: C) where C.Element == UInt8 {
        combine(UInt64(bytes.count))
        for byte in bytes { combine(byte) }
    }

    /// Feeds `count` (0–7) bytes at once: `word`'s low bytes, little-endian, its other bytes
    /// zero (the same stream as feeding them one at a time).
    @inline(__always)
    mutating func combine(partial word: UInt64, count: Int) {
        guard count > 0 else { return }
        length &+= UInt64(count)
        let shift = UInt64(tailCount) &* 8
        tail |= word << shift
        let total = tailCount &+ count
        if total >= 8 {
            // Only with pending bytes (count < 8): the word's high bytes start the next tail.
            compress(tail)
            tail = word >> (64 &- shift)
            tailCount = total &- 8
        } else {
            tailCount = total
        }
    }

    /// Feeds a byte count and then the bytes, eight at a time where it can. Field names and
    /// short strings are mostly the part after the last whole word: it goes in as one word too.
    public mutating func combine(lengthPrefixed bytes: UnsafeBufferPointer<UInt8>) {
        combine(UInt64(bytes.count))
        guard let base = bytes.baseAddress else { return }
        let raw = UnsafeRawPointer(base)
        let words = bytes.count / 8
        var i = 0
        while i < words {
            combine(UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: i &* 8, as: UInt64.self)))
            i &+= 1
        }
        var rest: UInt64 = 0
        let start = words &* 8
        var j = bytes.count
        while j > start {
            j &-= 1
            rest = rest << 8 | UInt64(base[j])
        }
        combine(partial: rest, count: bytes.count &- start)
    }

    /// Feeds a string as its UTF-8 bytes, length-prefixed.
    public mutating func combine(_ string: String) {
        var string = string
        string.withUTF8 { combine(lengthPrefixed: $0) }
    }

    /// The 128-bit result.
    public consuming func finalize() -> (UInt64, UInt64) {
        let b = (length << 56) | tail
        compress(b)
        v2 ^= 0xee
        round(); round(); round(); round()
        let first = v0 ^ v1 ^ v2 ^ v3
        v1 ^= 0xdd
        round(); round(); round(); round()
        let second = v0 ^ v1 ^ v2 ^ v3
        return (first, second)
    }
}

/// A 128-bit digest of a set of elements: the sum (mod 2¹²⁸, in two 64-bit lanes) of each
/// element's ``StableHasher`` value.
///
/// Because it is a sum, adding or removing one element updates it in O(1) — no rehash of the
/// whole state per edit — and the result does not depend on the order elements were added.
/// Two replicas with equal states have equal digests; unequal states collide with probability
/// about 2⁻¹²⁸ per comparison (for honest, non-adversarial states).
package struct StateDigest: Hashable, Sendable, CustomStringConvertible {
    public private(set) var high: UInt64
    public private(set) var low: UInt64

    public init(high: UInt64 = 0, low: UInt64 = 0) {
        self.high = high
        self.low = low
    }

    /// The digest of the empty state.
    public static let empty = StateDigest()

    public mutating func add(_ element: (UInt64, UInt64)) {
        high = high &+ element.0
        low = low &+ element.1
    }

    public mutating func remove(_ element: (UInt64, UInt64)) {
        high = high &- element.0
        low = low &- element.1
    }

    /// 32 lowercase hexadecimal digits.
    public var description: String { hex16(high) + hex16(low) }

    /// Parses ``description``.
    public init?(hex: String) {
        guard let id = ReplicaID(hex: hex) else { return nil }
        self.init(high: id.high, low: id.low)
    }
}
