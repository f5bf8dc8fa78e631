@_spi(Engine) import PeerSyncCRDT

// Attachment transfer messages (docs/PROTOCOL.md, "Attachments"). Bodies encoded like every
// other message (protobuf wire format through FieldWriter/FieldReader), framed with types
// 13–15. They are not cases of `Message`: only a peer whose hello announced
// ``HelloFeatures/attachments`` may receive them (a peer that predates them closes the session
// on an unknown type), so the session core sends and reads them itself. The pure decisions are
// `PeerSyncModel.AttachmentTransfer`.
//
//   attachmentRequest     1: hash (32 bytes)   2: offset (varint)   3: length (varint, 1…1 MiB)
//   attachmentData        1: hash (32 bytes)   2: offset (varint)   3: total (varint)   4: bytes
//   attachmentUnavailable 1: hash (32 bytes)

/// Bounds of the attachment messages.
package enum AttachmentWireLimits {
    /// Frame type of `attachmentRequest` (types 10–12 are `auth`, `breakdown`, `join`).
    package static let requestKind: UInt8 = 13
    /// Frame type of `attachmentData`.
    package static let dataKind: UInt8 = 14
    /// Frame type of `attachmentUnavailable`.
    package static let unavailableKind: UInt8 = 15
    /// The frame types of attachment messages.
    package static let kinds: ClosedRange<UInt8> = 13...15
    /// An upper bound on the bytes of an `attachmentData` frame beyond its payload (frame
    /// header, type, hash, offset, total and the payload's length prefix): a payload of
    /// `maxFrameBytes - dataFrameOverhead` bytes always fits a frame of `maxFrameBytes`.
    package static let dataFrameOverhead = 96
    /// The largest range one request may ask for, and one data message may carry: 1 MiB
    /// (a data frame stays far below ``WireLimits/defaultMaxFrameBytes``).
    package static let maxRangeBytes: UInt64 = 1 << 20
    /// The largest attachment a total may announce: 4 GiB (the store's own bound is lower).
    package static let maxTotalBytes: UInt64 = 1 << 32
}

/// "Send me `length` bytes of attachment `hash` from `offset`."
package struct AttachmentRequestBody: Sendable, Equatable {
    /// The SHA-256 of the attachment (32 bytes).
    package var hash: [UInt8]
    /// The first byte wanted.
    package var offset: UInt64
    /// How many bytes are wanted (1 … ``AttachmentWireLimits/maxRangeBytes``).
    package var length: UInt64

    /// A request body.
    package init(hash: [UInt8], offset: UInt64, length: UInt64) {
        self.hash = hash
        self.offset = offset
        self.length = length
    }
}

/// "Here are bytes `offset ..< offset + bytes.count` of attachment `hash`, which has `total` bytes."
package struct AttachmentDataBody: Sendable, Equatable {
    /// The SHA-256 of the attachment (32 bytes).
    package var hash: [UInt8]
    /// Where `bytes` start in the attachment.
    package var offset: UInt64
    /// The attachment's size.
    package var total: UInt64
    /// The bytes (at most ``AttachmentWireLimits/maxRangeBytes``).
    package var bytes: [UInt8]

    /// A data body.
    package init(hash: [UInt8], offset: UInt64, total: UInt64, bytes: [UInt8]) {
        self.hash = hash
        self.offset = offset
        self.total = total
        self.bytes = bytes
    }
}

/// The body of an `attachmentRequest` message.
package func encodeAttachmentRequest(_ request: AttachmentRequestBody) -> [UInt8] {
    var w = FieldWriter()
    w.bytes(1, request.hash)
    w.varint(2, request.offset)
    w.varint(3, request.length)
    return w.bytes
}

/// Decodes and checks an `attachmentRequest` body.
package func decodeAttachmentRequest(_ body: [UInt8]) throws(WireError) -> AttachmentRequestBody {
    let f = try FieldReader(message: "attachmentRequest", body: body)
    let request = AttachmentRequestBody(hash: try attachmentHash(f), offset: try f.varint(2, "offset"),
                                        length: try f.varint(3, "length"))
    guard request.length >= 1, request.length <= AttachmentWireLimits.maxRangeBytes else {
        throw .malformed(message: "attachmentRequest", detail: "length \(request.length) outside 1…\(AttachmentWireLimits.maxRangeBytes)")
    }
    guard request.offset < AttachmentWireLimits.maxTotalBytes else {
        throw .malformed(message: "attachmentRequest", detail: "offset \(request.offset) beyond any attachment")
    }
    return request
}

/// The body of an `attachmentData` message.
package func encodeAttachmentData(_ data: AttachmentDataBody) -> [UInt8] {
    var w = FieldWriter()
    w.bytes(1, data.hash)
    w.varint(2, data.offset)
    w.varint(3, data.total)
    w.bytes(4, data.bytes)
    return w.bytes
}

/// Decodes and checks an `attachmentData` body: the range lies inside `total`, carries at
/// most ``AttachmentWireLimits/maxRangeBytes``, and is not empty unless `total` is 0.
package func decodeAttachmentData(_ body: [UInt8]) throws(WireError) -> AttachmentDataBody {
    let f = try FieldReader(message: "attachmentData", body: body)
    let data = AttachmentDataBody(hash: try attachmentHash(f), offset: try f.varint(2, "offset"),
                                  total: try f.varint(3, "total"), bytes: try f.bytes(4, "bytes"))
    let count = UInt64(data.bytes.count)
    guard data.total <= AttachmentWireLimits.maxTotalBytes else {
        throw .malformed(message: "attachmentData", detail: "total \(data.total) over \(AttachmentWireLimits.maxTotalBytes)")
    }
    guard count <= AttachmentWireLimits.maxRangeBytes else {
        throw .malformed(message: "attachmentData", detail: "\(count) bytes in one message, over \(AttachmentWireLimits.maxRangeBytes)")
    }
    guard data.offset <= data.total, count <= data.total - data.offset, count > 0 || data.total == 0 else {
        throw .malformed(message: "attachmentData", detail: "bytes \(data.offset)+\(count) outside a total of \(data.total)")
    }
    return data
}

/// The body of an `attachmentUnavailable` message ("I do not hold the complete bytes of `hash`").
package func encodeAttachmentUnavailable(hash: [UInt8]) -> [UInt8] {
    var w = FieldWriter()
    w.bytes(1, hash)
    return w.bytes
}

/// Decodes an `attachmentUnavailable` body; returns the hash.
package func decodeAttachmentUnavailable(_ body: [UInt8]) throws(WireError) -> [UInt8] {
    try attachmentHash(FieldReader(message: "attachmentUnavailable", body: body))
}

private func attachmentHash(_ f: FieldReader) throws(WireError) -> [UInt8] {
    let hash = try f.bytes(1, "hash")
    guard hash.count == 32 else {
        throw .malformed(message: f.message, detail: "a SHA-256 hash has 32 bytes, got \(hash.count)")
    }
    return hash
}
