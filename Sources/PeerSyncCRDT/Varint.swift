/// LEB128 unsigned varints, as in protobuf: 7 bits a byte, low bits first, high bit = more.
package enum Varint {
    @inline(__always)
    public static func append(_ value: UInt64, to out: inout [UInt8]) {
        var v = value
        while v >= 0x80 {
            out.append(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        out.append(UInt8(v))
    }

    /// Bytes `append` would write for `value`.
    public static func size(of value: UInt64) -> Int {
        var v = value
        var n = 1
        while v >= 0x80 { v >>= 7; n += 1 }
        return n
    }
}

/// Reads the canonical encodings; every read is bounds-checked and returns nil when short.
package struct ByteReader {
    public let bytes: [UInt8]
    public private(set) var offset: Int = 0

    public init(_ bytes: [UInt8]) { self.bytes = bytes }

    public var isAtEnd: Bool { offset == bytes.count }
    public var remaining: Int { bytes.count - offset }

    public mutating func readByte() -> UInt8? {
        guard offset < bytes.count else { return nil }
        defer { offset += 1 }
        return bytes[offset]
    }

    /// A varint of at most 10 bytes; nil if truncated or overlong.
    public mutating func readVarint() -> UInt64? {
        var result: UInt64 = 0
        var shift: UInt64 = 0
        while shift < 70 {
            guard let byte = readByte() else { return nil }
            if shift == 63 && byte > 1 { return nil }
            result |= UInt64(byte & 0x7f) << shift
            if byte & 0x80 == 0 { return result }
            shift += 7
        }
        return nil
    }

    public mutating func readFixed64() -> UInt64? {
        guard remaining >= 8 else { return nil }
        var v: UInt64 = 0
        for i in 0..<8 { v |= UInt64(bytes[offset + i]) << (UInt64(i) * 8) }
        offset += 8
        return v
    }

    public mutating func readBytes(_ count: Int) -> ArraySlice<UInt8>? {
        guard count >= 0, remaining >= count else { return nil }
        defer { offset += count }
        return bytes[offset..<(offset + count)]
    }

    public mutating func readLengthPrefixed() -> ArraySlice<UInt8>? {
        guard let count = readVarint(), count <= UInt64(remaining) else { return nil }
        return readBytes(Int(count))
    }
}
