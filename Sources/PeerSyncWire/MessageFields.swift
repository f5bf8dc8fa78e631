@_spi(Engine) import PeerSyncCRDT

/// Message bodies are sequences of fields in protobuf's wire format, so that unknown fields
/// from newer peers can be skipped and any protobuf library can read them:
///
/// ```
/// field = varint(number << 3 | wire type) value
///   wire type 0: value = varint
///   wire type 1: value = 8 bytes          (never written; skipped when read)
///   wire type 2: value = varint(n) n bytes
///   wire type 5: value = 4 bytes          (never written; skipped when read)
/// ```
package struct FieldWriter {
    package var bytes: [UInt8] = []

    package init() {}

    package mutating func varint(_ number: UInt64, _ value: UInt64) {
        Varint.append(number << 3, to: &bytes)
        Varint.append(value, to: &bytes)
    }

    package mutating func bytes(_ number: UInt64, _ value: [UInt8]) {
        Varint.append(number << 3 | 2, to: &bytes)
        Varint.append(UInt64(value.count), to: &bytes)
        bytes.append(contentsOf: value)
    }

    package mutating func string(_ number: UInt64, _ value: String) {
        bytes(number, Array(value.utf8))
    }
}

/// Reads the fields of one message body; the last value of a repeated number wins, unknown
/// numbers are skipped. Numbers in `repeating` are protobuf repeated fields: every value of
/// wire type 2 is kept, in order, in ``lists``.
package struct FieldReader {
    package let message: String
    package var varints: [UInt64: UInt64] = [:]
    package var blobs: [UInt64: [UInt8]] = [:]
    package var lists: [UInt64: [[UInt8]]] = [:]

    package init(message: String, body: [UInt8], repeating: Set<UInt64> = []) throws(WireError) {
        self.message = message
        var reader = ByteReader(body)
        while !reader.isAtEnd {
            guard let key = reader.readVarint() else { throw .malformed(message: message, detail: "truncated field key") }
            let number = key >> 3
            switch key & 7 {
            case 0:
                guard let value = reader.readVarint() else { throw .malformed(message: message, detail: "truncated field \(number)") }
                varints[number] = value
            case 1:
                guard reader.readBytes(8) != nil else { throw .malformed(message: message, detail: "truncated field \(number)") }
            case 2:
                guard let value = reader.readLengthPrefixed() else { throw .malformed(message: message, detail: "truncated field \(number)") }
                blobs[number] = Array(value)
                if repeating.contains(number) { lists[number, default: []].append(Array(value)) }
            case 5:
                guard reader.readBytes(4) != nil else { throw .malformed(message: message, detail: "truncated field \(number)") }
            default:
                throw .malformed(message: message, detail: "field \(number) has unknown wire type \(key & 7)")
            }
        }
    }

    package func varint(_ number: UInt64, _ name: String) throws(WireError) -> UInt64 {
        guard let value = varints[number] else { throw .missingField(message: message, field: name) }
        return value
    }

    package func bytes(_ number: UInt64, _ name: String) throws(WireError) -> [UInt8] {
        guard let value = blobs[number] else { throw .missingField(message: message, field: name) }
        return value
    }

    package func string(_ number: UInt64, _ name: String) throws(WireError) -> String {
        guard let text = String(validating: try bytes(number, name), as: UTF8.self) else {
            throw .malformed(message: message, detail: "\(name) is not UTF-8")
        }
        return text
    }
}
