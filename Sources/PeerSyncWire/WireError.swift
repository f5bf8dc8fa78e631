@_spi(Engine) import PeerSyncCRDT

/// Why bytes from a peer were refused. Every case ends the session with a logged reason;
/// nothing of the offending frame is applied.
package enum WireError: Error, Equatable, CustomStringConvertible {
    case frameTooLarge(length: UInt64, limit: Int)
    case emptyFrame
    case malformedLength
    case unknownMessageType(UInt8)
    case malformed(message: String, detail: String)
    case missingField(message: String, field: String)
    case dictionaryFull

    package var description: String {
        switch self {
        case .frameTooLarge(let length, let limit): "frame of \(length) bytes exceeds the limit of \(limit)"
        case .emptyFrame: "empty frame"
        case .malformedLength: "malformed frame length"
        case .unknownMessageType(let type): "unknown message type \(type)"
        case .malformed(let message, let detail): "malformed \(message): \(detail)"
        case .missingField(let message, let field): "\(message) lacks required field \(field)"
        case .dictionaryFull: "peer defined more than \(WireDictionary.capacity) replica IDs or names in one session"
        }
    }
}
