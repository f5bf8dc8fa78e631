@_spi(Engine) import PeerSyncCRDT

/// Decodes a `Decodable` value from a ``FieldValue`` tree made by ``FieldEncoder`` (or by a
/// newer or older version of the type: unknown keys are ignored, missing optionals read nil).
package struct FieldDecoder: Sendable {
    public init() {}

    public func decode<T: Decodable>(_ type: T.Type, from value: FieldValue) throws -> T {
        try FieldDecoderImpl(value: value, codingPath: []).decodeValue(type)
    }

    public func decode<T: Decodable>(_ type: T.Type, fromFields fields: [String: FieldValue]) throws -> T {
        try decode(type, from: .map(fields))
    }
}

struct FieldDecoderImpl: Decoder {
    let value: FieldValue
    let codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func mismatch<T>(_ type: T.Type) -> DecodingError {
        .typeMismatch(type, .init(codingPath: codingPath, debugDescription: "expected \(type), found \(value.kindName)"))
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        guard case .map(let map) = value else { throw mismatch([String: FieldValue].self) }
        return KeyedDecodingContainer(KeyedFieldDecoder<Key>(map: map, codingPath: codingPath))
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        guard case .list(let items) = value else { throw mismatch([FieldValue].self) }
        return UnkeyedFieldDecoder(items: items, codingPath: codingPath)
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer {
        SingleFieldDecoder(decoder: self)
    }

    func decodeValue<T: Decodable>(_ type: T.Type) throws -> T {
        if let primitive = try primitive(type) { return primitive }
        return try T(from: self)
    }

    func integer<I: FixedWidthInteger>(_ type: I.Type) throws -> I {
        switch value {
        case .int(let v):
            guard let r = I(exactly: v) else { throw overflow(type) }
            return r
        case .double(let d):
            guard let r = I(exactly: d) else { throw overflow(type) }
            return r
        default: throw mismatch(type)
        }
    }

    func overflow<T>(_ type: T.Type) -> DecodingError {
        .dataCorrupted(.init(codingPath: codingPath, debugDescription: "\(value) does not fit \(type)"))
    }

    func double() throws -> Double {
        switch value {
        case .double(let d): return d
        case .int(let i): return Double(i)
        default: throw mismatch(Double.self)
        }
    }

    func primitive<T: Decodable>(_ type: T.Type) throws -> T? {
        switch type {
        case is Bool.Type:
            guard case .bool(let b) = value else { throw mismatch(type) }
            return b as? T
        case is String.Type:
            guard case .string(let s) = value else { throw mismatch(type) }
            return s as? T
        case is Double.Type: return try double() as? T
        case is Float.Type: return Float(try double()) as? T
        case is Int.Type: return try integer(Int.self) as? T
        case is Int8.Type: return try integer(Int8.self) as? T
        case is Int16.Type: return try integer(Int16.self) as? T
        case is Int32.Type: return try integer(Int32.self) as? T
        case is Int64.Type: return try integer(Int64.self) as? T
        case is UInt.Type: return try integer(UInt.self) as? T
        case is UInt8.Type: return try integer(UInt8.self) as? T
        case is UInt16.Type: return try integer(UInt16.self) as? T
        case is UInt32.Type: return try integer(UInt32.self) as? T
        case is UInt64.Type: return try integer(UInt64.self) as? T
        case is Data.Type:
            guard case .bytes(let b) = value else { throw mismatch(type) }
            return Data(b) as? T
        case is FieldValue.Type: return value as? T
        case is UUID.Type:
            switch value {
            case .uuid(let id): return id as? T
            case .string(let text):
                guard let id = UUID(uuidString: text) else { throw mismatch(type) }
                return id as? T
            default: throw mismatch(type)
            }
        default: return nil
        }
    }
}

struct KeyedFieldDecoder<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let map: [String: FieldValue]
    let codingPath: [any CodingKey]

    var allKeys: [Key] { map.keys.compactMap { Key(stringValue: $0) } }

    func contains(_ key: Key) -> Bool { map[key.stringValue] != nil }

    private func value(for key: Key) throws -> FieldValue {
        guard let v = map[key.stringValue] else {
            throw DecodingError.keyNotFound(key, .init(codingPath: codingPath, debugDescription: "no field \"\(key.stringValue)\""))
        }
        return v
    }

    func decodeNil(forKey key: Key) throws -> Bool {
        (map[key.stringValue] ?? .null) == .null
    }

    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        try FieldDecoderImpl(value: value(for: key), codingPath: codingPath + [key]).decodeValue(type)
    }

    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
        try FieldDecoderImpl(value: value(for: key), codingPath: codingPath + [key]).container(keyedBy: type)
    }

    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        try FieldDecoderImpl(value: value(for: key), codingPath: codingPath + [key]).unkeyedContainer()
    }

    func superDecoder() throws -> any Decoder {
        FieldDecoderImpl(value: map["super"] ?? .null, codingPath: codingPath)
    }

    func superDecoder(forKey key: Key) throws -> any Decoder {
        FieldDecoderImpl(value: map[key.stringValue] ?? .null, codingPath: codingPath + [key])
    }
}

struct UnkeyedFieldDecoder: UnkeyedDecodingContainer {
    let items: [FieldValue]
    let codingPath: [any CodingKey]
    var currentIndex = 0

    init(items: [FieldValue], codingPath: [any CodingKey]) {
        self.items = items
        self.codingPath = codingPath
    }

    var count: Int? { items.count }
    var isAtEnd: Bool { currentIndex >= items.count }

    private mutating func next<T>(_ type: T.Type) throws -> FieldDecoderImpl {
        guard !isAtEnd else {
            throw DecodingError.valueNotFound(type, .init(codingPath: codingPath, debugDescription: "list ended"))
        }
        defer { currentIndex += 1 }
        return FieldDecoderImpl(value: items[currentIndex], codingPath: codingPath + [IndexKey(currentIndex)])
    }

    mutating func decodeNil() throws -> Bool {
        guard !isAtEnd, items[currentIndex] == .null else { return false }
        currentIndex += 1
        return true
    }

    mutating func decode<T: Decodable>(_ type: T.Type) throws -> T {
        try next(type).decodeValue(type)
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type) throws -> KeyedDecodingContainer<NestedKey> {
        try next([String: FieldValue].self).container(keyedBy: type)
    }

    mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer {
        try next([FieldValue].self).unkeyedContainer()
    }

    mutating func superDecoder() throws -> any Decoder {
        try next(FieldValue.self)
    }
}

struct SingleFieldDecoder: SingleValueDecodingContainer {
    let decoder: FieldDecoderImpl
    var codingPath: [any CodingKey] { decoder.codingPath }

    func decodeNil() -> Bool { decoder.value == .null }

    func decode<T: Decodable>(_ type: T.Type) throws -> T {
        try decoder.decodeValue(type)
    }
}

extension FieldValue {
    /// A word for error messages: "null", "string", "integer", ….
    public var kindName: String {
        switch self {
        case .null: "null"
        case .bool: "boolean"
        case .int: "integer"
        case .double: "number"
        case .string: "string"
        case .bytes: "bytes"
        case .list: "list"
        case .map: "map"
        case .uuid: "UUID"
        }
    }
}
