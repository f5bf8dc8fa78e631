@_spi(Engine) import PeerSyncCRDT

/// The SHA-256 of an attachment's bytes: its name in the content-addressed store and on the wire.
public struct AttachmentHash: Hashable, Comparable, Sendable, Codable, CustomStringConvertible {
    /// The 32 bytes of the digest.
    public let bytes: [UInt8]

    /// The hash with these 32 bytes; nil for any other length.
    public init?(bytes: some Collection<UInt8>) {
        guard bytes.count == 32 else { return nil }
        self.bytes = Array(bytes)
    }

    /// Parses 64 hexadecimal digits (either case).
    public init?(hex: some StringProtocol) {
        let digits = Array(hex.utf8)
        guard digits.count == 64 else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(32)
        for i in stride(from: 0, to: 64, by: 2) {
            guard let high = Self.nibble(digits[i]), let low = Self.nibble(digits[i + 1]) else { return nil }
            bytes.append(high << 4 | low)
        }
        self.bytes = bytes
    }

    private static func nibble(_ c: UInt8) -> UInt8? {
        switch c {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): c - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): c - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): c - UInt8(ascii: "A") + 10
        default: nil
        }
    }

    /// 64 lowercase hexadecimal digits (the file name in `DIR/attachments/`).
    public var hex: String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(64)
        for byte in bytes {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 15)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The 64 hexadecimal digits.
    public var description: String { hex }

    /// Orders hashes by their bytes.
    public static func < (lhs: AttachmentHash, rhs: AttachmentHash) -> Bool { lhs.bytes.lexicographicallyPrecedes(rhs.bytes) }

    /// Decodes the 32 bytes (a `Data` value); refuses any other length.
    public init(from decoder: any Decoder) throws {
        let data = try decoder.singleValueContainer().decode(Data.self)
        guard let hash = AttachmentHash(bytes: data) else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath,
                                                    debugDescription: "a SHA-256 hash has 32 bytes, got \(data.count)"))
        }
        self = hash
    }

    /// Encodes the 32 bytes as one `Data` value (a bytes field).
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(Data(bytes))
    }
}

/// A binary attachment a record refers to (a book cover, a voice note): its content hash,
/// size and media type. The bytes live beside the store, content-addressed
/// (`DIR/attachments/<hex sha256>`), and travel between peers separately from the record,
/// only when a device needs them.
///
/// As a record property it is one field whose value is a map with exactly these entries:
///
/// | key      | value                                   |
/// |----------|-----------------------------------------|
/// | `sha256` | ``FieldValue/bytes(_:)``, 32 bytes       |
/// | `size`   | ``FieldValue/int(_:)``, ≥ 0 (bytes)      |
/// | `type`   | ``FieldValue/string(_:)``, a media type  |
///
/// Any map of that shape anywhere in a visible record's fields (also inside lists and nested
/// maps) counts as a reference that keeps the bytes from being purged.
public struct Attachment: Hashable, Sendable, Codable {
    /// The SHA-256 of the bytes.
    public let contentHash: AttachmentHash
    /// The number of bytes.
    public let byteCount: Int64
    /// A media type such as `image/jpeg`; `application/octet-stream` when unknown.
    public let mediaType: String

    /// An attachment of `byteCount` bytes (not negative) hashing to `contentHash`.
    public init(contentHash: AttachmentHash, byteCount: Int64, mediaType: String = "application/octet-stream") {
        precondition(byteCount >= 0, "an attachment's size is not negative")
        self.contentHash = contentHash
        self.byteCount = byteCount
        self.mediaType = mediaType
    }

    enum CodingKeys: String, CodingKey {
        case contentHash = "sha256"
        case byteCount = "size"
        case mediaType = "type"
    }

    /// Decodes the `sha256`, `size` and `type` entries; refuses a negative size or a hash of
    /// another length.
    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        contentHash = try container.decode(AttachmentHash.self, forKey: .contentHash)
        byteCount = try container.decode(Int64.self, forKey: .byteCount)
        mediaType = try container.decode(String.self, forKey: .mediaType)
        guard byteCount >= 0 else {
            throw DecodingError.dataCorruptedError(forKey: .byteCount, in: container, debugDescription: "negative size \(byteCount)")
        }
    }

    /// The attachment a field value encodes, or nil if it is not exactly the map above.
    public init?(fieldValue: FieldValue) {
        guard case .map(let map) = fieldValue, map.count == 3,
              case .bytes(let hash)? = map[CodingKeys.contentHash.rawValue], let contentHash = AttachmentHash(bytes: hash),
              case .int(let size)? = map[CodingKeys.byteCount.rawValue], size >= 0,
              case .string(let type)? = map[CodingKeys.mediaType.rawValue] else { return nil }
        self.init(contentHash: contentHash, byteCount: size, mediaType: type)
    }

    /// This attachment as a field value.
    public var fieldValue: FieldValue {
        .map([CodingKeys.contentHash.rawValue: .bytes(contentHash.bytes),
              CodingKeys.byteCount.rawValue: .int(byteCount),
              CodingKeys.mediaType.rawValue: .string(mediaType)])
    }

    /// Every attachment referenced anywhere in `fields` (nested lists and maps included).
    ///
    /// - Complexity: O(size of the values).
    public static func referenced(in fields: [String: FieldValue]) -> Set<Attachment> {
        var found: Set<Attachment> = []
        for value in fields.values { collect(value, into: &found) }
        return found
    }

    /// Adds every attachment referenced in `record`'s current field values to `found`, without
    /// building its values dictionary (a node's first session scans every record held).
    package static func collectReferenced(in record: RecordState, into found: inout Set<Attachment>) {
        for register in record.fields.values {
            switch register.value {
            case .map, .list: collect(register.value, into: &found)
            default: continue
            }
        }
    }

    private static func collect(_ value: FieldValue, into found: inout Set<Attachment>) {
        switch value {
        case .map(let map):
            if let attachment = Attachment(fieldValue: value) {
                found.insert(attachment)
                return
            }
            for nested in map.values { collect(nested, into: &found) }
        case .list(let items):
            for item in items { collect(item, into: &found) }
        default:
            break
        }
    }
}
