/// What a relay's operator gives an admin to enrol the relay in a group (docs/RELAY.md): the
/// relay's device ID, so the admin dials that relay and no other, and the relay's enrolment
/// secret, so only those the operator told can start a group there. Text: `PSL-`, Crockford
/// base32 of bytes20(relay device ID) ‖ bytes16(secret) in groups of four, `-`, a check character
/// (the invite code's alphabet and check, PROTOCOL §12 and §20.3).
package struct RelayCode: Sendable, Equatable, CustomStringConvertible {
    public let relay: DeviceID
    public let secret: [UInt8]
    static let prefix = "PSL"
    static let secretBytes = 16

    public init(relay: DeviceID, secret: [UInt8]) {
        precondition(secret.count == Self.secretBytes)
        self.relay = relay
        self.secret = secret
    }

    /// Parses a code as ``description`` writes it (case, spaces and dashes are ignored).
    public init(parsing text: String) throws(RelayCodeError) {
        let payload: [UInt8]
        do {
            payload = try CrockfordBase32.payload(ofCode: text, prefix: Self.prefix, byteCount: 20 + Self.secretBytes)
        } catch {
            switch error {
            case .badPrefix: throw RelayCodeError(problem: "it does not start with PSL- (is it an invite or a recovery code?)")
            case let .wrongLength(found, expected): throw RelayCodeError(problem: "\(found) characters after PSL-, expected \(expected)")
            case let .badCharacter(character, position): throw RelayCodeError(problem: "'\(character)' at position \(position) is not a code character")
            case .checkMismatch: throw RelayCodeError(problem: "the check character does not match (a typo?)")
            }
        }
        self.init(relay: DeviceID(bytes: payload[..<20])!, secret: Array(payload[20...]))
    }

    public var description: String { CrockfordBase32.code(prefix: Self.prefix, payload: relay.bytes + secret) }
}

/// A relay code that does not read.
package struct RelayCodeError: Error, Equatable, CustomStringConvertible {
    public let problem: String
    public var description: String { "invalid relay code: \(problem)" }
}
