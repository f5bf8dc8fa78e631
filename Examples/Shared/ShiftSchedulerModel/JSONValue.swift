import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel

/// A JSON document as a value, for import and export. Integers that fit 64 bits stay exact.
package enum JSONValue: Codable, Equatable, Sendable {
    case null
    case bool(Bool)
    case int(Int64)
    case double(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    public init(from decoder: any Decoder) throws {
        let container = try decoder.singleValueContainer()
        if container.decodeNil() { self = .null }
        else if let v = try? container.decode(Bool.self) { self = .bool(v) }
        else if let v = try? container.decode(Int64.self) { self = .int(v) }
        else if let v = try? container.decode(Double.self) { self = .double(v) }
        else if let v = try? container.decode(String.self) { self = .string(v) }
        else if let v = try? container.decode([JSONValue].self) { self = .array(v) }
        else { self = .object(try container.decode([String: JSONValue].self)) }
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        switch self {
        case .null: try container.encodeNil()
        case .bool(let v): try container.encode(v)
        case .int(let v): try container.encode(v)
        case .double(let v): try container.encode(v)
        case .string(let v): try container.encode(v)
        case .array(let v): try container.encode(v)
        case .object(let v): try container.encode(v)
        }
    }

    /// The field value this JSON stands for (bytes have no JSON form: they export as base64
    /// strings and import as strings).
    public var fieldValue: FieldValue {
        switch self {
        case .null: .null
        case .bool(let v): .bool(v)
        case .int(let v): .int(v)
        case .double(let v): .double(v)
        case .string(let v): .string(v)
        case .array(let v): .list(v.map(\.fieldValue))
        case .object(let v): .map(v.mapValues(\.fieldValue))
        }
    }

    public init(_ value: FieldValue) {
        switch value {
        case .null: self = .null
        case .bool(let v): self = .bool(v)
        case .int(let v): self = .int(v)
        case .double(let v): self = .double(v)
        case .string(let v): self = .string(v)
        case .bytes(let v): self = .string(Data(v).base64EncodedString())
        case .list(let v): self = .array(v.map(JSONValue.init))
        case .map(let v): self = .object(v.mapValues(JSONValue.init))
        case .uuid(let v): self = .string(v.uuidString)
        }
    }
}

extension JSONValue {
    /// A number as an error message shows it (`1e+300`, `-5`); other kinds by their JSON.
    var numberText: String {
        switch self {
        case .int(let v): "\(v)"
        case .double(let v): "\(v)"
        default: "\(self)"
        }
    }
}
