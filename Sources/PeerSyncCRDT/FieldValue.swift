/// The value of one field of a record: a small self-describing tree, like JSON with exact
/// integers and bytes.
///
/// Values have one canonical binary form (``encode(into:)``), used for storage, digests and
/// ordering ties; maps encode their keys sorted, so equal values encode to equal bytes.
/// Doubles compare by bit pattern, so `NaN == NaN` and equality stays an equivalence.
public enum FieldValue: Sendable {
    case null
    case bool(Bool)
    case int(Int64)
    case double(Double)
    case string(String)
    case bytes([UInt8])
    case list([FieldValue])
    case map([String: FieldValue])
    /// A UUID (16 bytes on the wire and on disk, not a 36-character string).
    case uuid(UUID)
}

extension FieldValue: Hashable {
    public static func == (lhs: FieldValue, rhs: FieldValue) -> Bool {
        switch (lhs, rhs) {
        case (.null, .null): true
        case let (.bool(a), .bool(b)): a == b
        case let (.int(a), .int(b)): a == b
        case let (.double(a), .double(b)): a.bitPattern == b.bitPattern
        case let (.string(a), .string(b)): a == b
        case let (.bytes(a), .bytes(b)): a == b
        case let (.list(a), .list(b)): a == b
        case let (.map(a), .map(b)): a == b
        case let (.uuid(a), .uuid(b)): a == b
        default: false
        }
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(tag)
        switch self {
        case .null: break
        case .bool(let v): hasher.combine(v)
        case .int(let v): hasher.combine(v)
        case .double(let v): hasher.combine(v.bitPattern)
        case .string(let v): hasher.combine(v)
        case .bytes(let v): hasher.combine(v)
        case .list(let v): hasher.combine(v)
        case .map(let v): hasher.combine(v)
        case .uuid(let v): hasher.combine(v)
        }
    }
}

extension FieldValue: Comparable {
    /// A total order: by kind (null < bool < int < double < string < bytes < list < map < uuid), then
    /// by value. Used only to break ties deterministically.
    public static func < (lhs: FieldValue, rhs: FieldValue) -> Bool {
        if lhs.tag != rhs.tag { return lhs.tag < rhs.tag }
        switch (lhs, rhs) {
        case let (.bool(a), .bool(b)): return !a && b
        case let (.int(a), .int(b)): return a < b
        case let (.double(a), .double(b)): return a.bitPattern < b.bitPattern
        case let (.string(a), .string(b)): return a.utf8.lexicographicallyPrecedes(b.utf8)
        case let (.bytes(a), .bytes(b)): return a.lexicographicallyPrecedes(b)
        case let (.list(a), .list(b)): return a.lexicographicallyPrecedes(b)
        case let (.map(a), .map(b)):
            let sa = a.sorted { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }
            let sb = b.sorted { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }
            return sa.lexicographicallyPrecedes(sb) { x, y in
                x.key != y.key ? x.key.utf8.lexicographicallyPrecedes(y.key.utf8) : x.value < y.value
            }
        case let (.uuid(a), .uuid(b)):
            return withUnsafeBytes(of: a.uuid) { ab in withUnsafeBytes(of: b.uuid) { bb in ab.lexicographicallyPrecedes(bb) } }
        default: return false
        }
    }
}

extension FieldValue {
    /// The one-byte kind tag of the canonical encoding.
    public var tag: UInt8 {
        switch self {
        case .null: 0
        case .bool(false): 1
        case .bool(true): 2
        case .int: 3
        case .double: 4
        case .string: 5
        case .bytes: 6
        case .list: 7
        case .map: 8
        case .uuid: 9
        }
    }

    /// Appends the canonical encoding:
    ///
    /// ```
    /// null        00
    /// false/true  01 / 02
    /// int         03 zigzag-varint
    /// double      04 8 bytes IEEE-754 little-endian
    /// string      05 varint(byte count) UTF-8
    /// bytes       06 varint(byte count) bytes
    /// list        07 varint(count) value…
    /// map         08 varint(count) (varint(key bytes) key-UTF-8 value)… keys sorted bytewise
    /// uuid        09 16 bytes (RFC 4122 byte order)
    /// ```
    public func encode(into out: inout [UInt8]) {
        out.append(tag)
        switch self {
        case .null, .bool: break
        case .int(let v): Varint.append(UInt64(bitPattern: (v << 1) ^ (v >> 63)), to: &out)
        case .double(let v):
            withUnsafeBytes(of: v.bitPattern.littleEndian) { out.append(contentsOf: $0) }
        case .string(let v):
            Varint.append(UInt64(v.utf8.count), to: &out)
            out.append(contentsOf: v.utf8)
        case .bytes(let v):
            Varint.append(UInt64(v.count), to: &out)
            out.append(contentsOf: v)
        case .list(let items):
            Varint.append(UInt64(items.count), to: &out)
            for item in items { item.encode(into: &out) }
        case .map(let entries):
            Varint.append(UInt64(entries.count), to: &out)
            for key in entries.keys.sorted(by: { $0.utf8.lexicographicallyPrecedes($1.utf8) }) {
                Varint.append(UInt64(key.utf8.count), to: &out)
                out.append(contentsOf: key.utf8)
                entries[key]!.encode(into: &out)
            }
        case .uuid(let v):
            withUnsafeBytes(of: v.uuid) { out.append(contentsOf: $0) }
        }
    }

    /// The canonical encoding as a new array.
    public var encoded: [UInt8] {
        var out: [UInt8] = []
        encode(into: &out)
        return out
    }

    /// Decodes one value from the canonical encoding. Nesting deeper than
    /// ``ValidationLimits/maxValueDepth`` (64) levels, and a map with a key twice, are refused.
    package init(decoding bytes: some Collection<UInt8>) throws(FieldValueDecodingError) {
        var reader = ByteReader(Array(bytes))
        self = try FieldValue.decode(from: &reader, depth: 0)
        guard reader.isAtEnd else { throw .trailingBytes }
    }

    /// Decodes one value at the reader's position (nesting deeper than 64 levels is refused).
    ///
    /// - Complexity: O(bytes read); every count is checked against the bytes left first.
    package static func decode(from reader: inout ByteReader, depth: Int) throws(FieldValueDecodingError) -> FieldValue {
        guard depth < ValidationLimits.maxValueDepth else { throw .tooDeep }
        guard let tag = reader.readByte() else { throw .truncated }
        switch tag {
        case 0: return .null
        case 1: return .bool(false)
        case 2: return .bool(true)
        case 3:
            guard let raw = reader.readVarint() else { throw .truncated }
            return .int(Int64(bitPattern: (raw >> 1) ^ (0 &- (raw & 1))))
        case 4:
            guard let bits = reader.readFixed64() else { throw .truncated }
            return .double(Double(bitPattern: bits))
        case 5:
            guard let bytes = reader.readLengthPrefixed() else { throw .truncated }
            guard let string = String(validating: bytes, as: UTF8.self) else { throw .invalidUTF8 }
            return .string(string)
        case 6:
            guard let bytes = reader.readLengthPrefixed() else { throw .truncated }
            return .bytes(Array(bytes))
        case 7:
            guard let count = reader.readVarint(), count <= UInt64(reader.remaining) else { throw .truncated }
            var items: [FieldValue] = []
            items.reserveCapacity(Int(count))
            for _ in 0..<count { items.append(try decode(from: &reader, depth: depth + 1)) }
            return .list(items)
        case 8:
            guard let count = reader.readVarint(), count <= UInt64(reader.remaining) else { throw .truncated }
            var entries: [String: FieldValue] = [:]
            for _ in 0..<count {
                guard let keyBytes = reader.readLengthPrefixed() else { throw .truncated }
                guard let key = String(validating: keyBytes, as: UTF8.self) else { throw .invalidUTF8 }
                let value = try decode(from: &reader, depth: depth + 1)
                guard entries.updateValue(value, forKey: key) == nil else { throw .duplicateKey(key) }
            }
            return .map(entries)
        case 9:
            guard let b = reader.readBytes(16) else { throw .truncated }
            let a = Array(b)
            return .uuid(UUID(uuid: (a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15])))
        default:
            throw .unknownTag(tag)
        }
    }

    /// Whether some value inside this one sits more than `limit` levels below it (the items of
    /// a list are one level below the list). The canonical decoding accepts a value iff it is
    /// not nested deeper than ``ValidationLimits/maxValueDepth`` − 1; the store refuses a
    /// change that holds a value it could not read back.
    ///
    /// - Complexity: O(size), visiting at most `limit + 1` levels.
    public func isNested(deeperThan limit: Int) -> Bool {
        switch self {
        case .list(let items): items.contains { limit <= 0 || $0.isNested(deeperThan: limit - 1) }
        case .map(let entries): entries.values.contains { limit <= 0 || $0.isNested(deeperThan: limit - 1) }
        default: false
        }
    }

    /// Feeds the canonical encoding to `hasher` without building it in memory.
    package func feed(into hasher: inout StableHasher) {
        hasher.combine(tag)
        switch self {
        case .null, .bool: break
        case .int(let v): hasher.combine(UInt64(bitPattern: v))
        case .double(let v): hasher.combine(v.bitPattern)
        case .string(let v): hasher.combine(v)
        case .bytes(let v): v.withUnsafeBufferPointer { hasher.combine(lengthPrefixed: $0) }
        case .list(let items):
            hasher.combine(UInt64(items.count))
            for item in items { item.feed(into: &hasher) }
        case .map(let entries):
            hasher.combine(UInt64(entries.count))
            for key in entries.keys.sorted(by: { $0.utf8.lexicographicallyPrecedes($1.utf8) }) {
                hasher.combine(key)
                entries[key]!.feed(into: &hasher)
            }
        case .uuid(let v):
            withUnsafeBytes(of: v.uuid) { raw in
                hasher.combine(raw.loadUnaligned(fromByteOffset: 0, as: UInt64.self))
                hasher.combine(raw.loadUnaligned(fromByteOffset: 8, as: UInt64.self))
            }
        }
    }
}

/// Why bytes are not a canonical ``FieldValue``.
package enum FieldValueDecodingError: Error, Equatable, CustomStringConvertible {
    case truncated
    case trailingBytes
    case invalidUTF8
    case unknownTag(UInt8)
    case tooDeep
    case duplicateKey(String)

    public var description: String {
        switch self {
        case .truncated: "field value is truncated"
        case .trailingBytes: "field value has trailing bytes"
        case .invalidUTF8: "field value holds a string that is not UTF-8"
        case .unknownTag(let tag): "field value has unknown kind tag \(tag)"
        case .tooDeep: "field value nests deeper than \(ValidationLimits.maxValueDepth) levels"
        case .duplicateKey(let key): "field value holds a map with the key \"\(key)\" twice"
        }
    }
}

extension FieldValue: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral, ExpressibleByBooleanLiteral,
    ExpressibleByFloatLiteral, ExpressibleByNilLiteral
{
    public init(stringLiteral value: String) { self = .string(value) }
    public init(integerLiteral value: Int64) { self = .int(value) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(floatLiteral value: Double) { self = .double(value) }
    public init(nilLiteral: ()) { self = .null }
}
