@_spi(Engine) import PeerSyncCRDT

/// Encodes a `Codable` value into a ``FieldValue`` tree: keyed containers become `.map`,
/// unkeyed ones `.list`, integers `.int`, floating point `.double`, `Data` `.bytes`.
///
/// `nil` optionals encode as `.null` (not as a missing key), so a record type can clear a
/// field, while fields the type does not know are simply absent and stay untouched.
package struct FieldEncoder: Sendable {
    public init() {}

    public func encode<T: Encodable>(_ value: T) throws -> FieldValue {
        let node = EncodingNode()
        try FieldEncoderImpl(node: node, codingPath: []).encodeValue(value)
        return node.resolve()
    }

    /// Encodes a record; its top level must be a keyed container.
    public func encodeFields<T: Encodable>(_ value: T) throws -> [String: FieldValue] {
        guard case .map(let fields) = try encode(value) else {
            throw EncodingError.invalidValue(value, .init(codingPath: [], debugDescription: "a record must encode as a keyed container"))
        }
        return fields
    }
}

final class EncodingNode {
    enum Content {
        case empty
        case value(FieldValue)
        case map([String: EncodingNode])
        case list([EncodingNode])
    }
    var content: Content = .empty

    func resolve() -> FieldValue {
        switch content {
        case .empty: .map([:])
        case .value(let v): v
        case .map(let m): .map(m.mapValues { $0.resolve() })
        case .list(let l): .list(l.map { $0.resolve() })
        }
    }
}

struct FieldEncoderImpl: Encoder {
    let node: EncodingNode
    let codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        if case .map = node.content {} else { node.content = .map([:]) }
        return KeyedEncodingContainer(KeyedFieldEncoder<Key>(node: node, codingPath: codingPath))
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        if case .list = node.content {} else { node.content = .list([]) }
        return UnkeyedFieldEncoder(node: node, codingPath: codingPath)
    }

    func singleValueContainer() -> any SingleValueEncodingContainer {
        SingleFieldEncoder(node: node, codingPath: codingPath)
    }

    func encodeValue<T: Encodable>(_ value: T) throws {
        if let primitive = try Self.primitive(value, codingPath) {
            node.content = .value(primitive)
        } else {
            try value.encode(to: self)
        }
    }

    static func primitive<T: Encodable>(_ value: T, _ path: [any CodingKey]) throws -> FieldValue? {
        switch value {
        case let v as Bool: return .bool(v)
        case let v as String: return .string(v)
        case let v as Double: return .double(v)
        case let v as Float: return .double(Double(v))
        case let v as Int: return .int(Int64(v))
        case let v as Int8: return .int(Int64(v))
        case let v as Int16: return .int(Int64(v))
        case let v as Int32: return .int(Int64(v))
        case let v as Int64: return .int(v)
        case let v as UInt8: return .int(Int64(v))
        case let v as UInt16: return .int(Int64(v))
        case let v as UInt32: return .int(Int64(v))
        case let v as UInt: return try unsigned(UInt64(v), path)
        case let v as UInt64: return try unsigned(v, path)
        case let v as Data: return .bytes(Array(v))
        case let v as UUID: return .uuid(v)
        case let v as FieldValue: return v
        default: return nil
        }
    }

    static func unsigned(_ v: UInt64, _ path: [any CodingKey]) throws -> FieldValue {
        guard let i = Int64(exactly: v) else {
            throw EncodingError.invalidValue(v, .init(codingPath: path, debugDescription: "\(v) does not fit a 64-bit signed field"))
        }
        return .int(i)
    }
}

struct KeyedFieldEncoder<Key: CodingKey>: KeyedEncodingContainerProtocol {
    let node: EncodingNode
    let codingPath: [any CodingKey]

    private func set(_ child: EncodingNode, for key: Key) {
        guard case .map(var map) = node.content else { return }
        map[key.stringValue] = child
        node.content = .map(map)
    }

    private func child(for key: Key) -> EncodingNode {
        let child = EncodingNode()
        set(child, for: key)
        return child
    }

    mutating func encodeNil(forKey key: Key) throws {
        child(for: key).content = .value(.null)
    }

    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
        try FieldEncoderImpl(node: child(for: key), codingPath: codingPath + [key]).encodeValue(value)
    }

    // Optionals that are nil become .null: the type knows the field and says it is empty.
    mutating func encodeIfPresent<T: Encodable>(_ value: T?, forKey key: Key) throws {
        if let value { try encode(value, forKey: key) } else { try encodeNil(forKey: key) }
    }
    mutating func encodeIfPresent(_ value: String?, forKey key: Key) throws {
        if let value { try encode(value, forKey: key) } else { try encodeNil(forKey: key) }
    }
    mutating func encodeIfPresent(_ value: Int?, forKey key: Key) throws {
        if let value { try encode(value, forKey: key) } else { try encodeNil(forKey: key) }
    }
    mutating func encodeIfPresent(_ value: Double?, forKey key: Key) throws {
        if let value { try encode(value, forKey: key) } else { try encodeNil(forKey: key) }
    }
    mutating func encodeIfPresent(_ value: Bool?, forKey key: Key) throws {
        if let value { try encode(value, forKey: key) } else { try encodeNil(forKey: key) }
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key) -> KeyedEncodingContainer<NestedKey> {
        FieldEncoderImpl(node: child(for: key), codingPath: codingPath + [key]).container(keyedBy: keyType)
    }

    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        FieldEncoderImpl(node: child(for: key), codingPath: codingPath + [key]).unkeyedContainer()
    }

    mutating func superEncoder() -> any Encoder {
        FieldEncoderImpl(node: child(for: Key(stringValue: "super")!), codingPath: codingPath)
    }

    mutating func superEncoder(forKey key: Key) -> any Encoder {
        FieldEncoderImpl(node: child(for: key), codingPath: codingPath + [key])
    }
}

struct IndexKey: CodingKey {
    var stringValue: String
    var intValue: Int?
    init(_ index: Int) { stringValue = "\(index)"; intValue = index }
    init?(stringValue: String) { self.stringValue = stringValue; intValue = Int(stringValue) }
    init?(intValue: Int) { self.init(intValue) }
}

struct UnkeyedFieldEncoder: UnkeyedEncodingContainer {
    let node: EncodingNode
    let codingPath: [any CodingKey]

    var count: Int {
        if case .list(let items) = node.content { return items.count }
        return 0
    }

    private func append() -> EncodingNode {
        let child = EncodingNode()
        if case .list(var items) = node.content {
            items.append(child)
            node.content = .list(items)
        }
        return child
    }

    mutating func encodeNil() throws { append().content = .value(.null) }

    mutating func encode<T: Encodable>(_ value: T) throws {
        let path = codingPath + [IndexKey(count)]
        try FieldEncoderImpl(node: append(), codingPath: path).encodeValue(value)
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type) -> KeyedEncodingContainer<NestedKey> {
        let path = codingPath + [IndexKey(count)]
        return FieldEncoderImpl(node: append(), codingPath: path).container(keyedBy: keyType)
    }

    mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
        let path = codingPath + [IndexKey(count)]
        return FieldEncoderImpl(node: append(), codingPath: path).unkeyedContainer()
    }

    mutating func superEncoder() -> any Encoder {
        FieldEncoderImpl(node: append(), codingPath: codingPath)
    }
}

struct SingleFieldEncoder: SingleValueEncodingContainer {
    let node: EncodingNode
    let codingPath: [any CodingKey]

    mutating func encodeNil() throws { node.content = .value(.null) }

    mutating func encode<T: Encodable>(_ value: T) throws {
        try FieldEncoderImpl(node: node, codingPath: codingPath).encodeValue(value)
    }
}
