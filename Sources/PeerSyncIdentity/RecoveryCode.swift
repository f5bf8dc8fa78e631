import Crypto

/// What restores a group's administration when its admin devices are lost, as text a person
/// keeps offline (printed once when the group is made, or by `makeRecoveryCode`):
///
/// ```
/// PSR-XXXX-XXXX-…-XXX-C
/// ```
/// `PSR-`, then 77 Crockford base32 characters of 48 bytes — group ID (16) ‖ the recovery key's
/// P-256 private scalar (32, big-endian) — in groups of 4 (the last of 1), then `-` and a check
/// character, read and written exactly as invite codes (PROTOCOL §12.3).
///
/// The roster holds the recovery key's public half as a device of role `recovery`: an admin's
/// rights to sign, never a session. Whoever holds the code can enrol a new admin device.
package struct RecoveryCode: Hashable, Sendable, CustomStringConvertible {
    package let groupID: GroupID
    package let key: DeviceKey

    static let prefix = "PSR"
    static let payloadBytes = GroupID.byteCount + 32

    package init(groupID: GroupID, key: DeviceKey) {
        self.groupID = groupID
        self.key = key
    }

    var payload: [UInt8] { groupID.bytes + Array(key.privateKey.rawRepresentation) }

    /// The code as text.
    package var text: String { CrockfordBase32.code(prefix: Self.prefix, payload: payload) }

    package var description: String { text }

    package static func == (lhs: RecoveryCode, rhs: RecoveryCode) -> Bool { lhs.payload == rhs.payload }
    package func hash(into hasher: inout Hasher) { hasher.combine(payload) }

    /// Parses a code; the error says what is wrong.
    package init(parsing text: String) throws(RecoveryCodeParseError) {
        let payload: [UInt8]
        do {
            payload = try CrockfordBase32.payload(ofCode: text, prefix: Self.prefix, byteCount: Self.payloadBytes)
        } catch {
            switch error {
            case .badPrefix: throw .badPrefix
            case let .wrongLength(found, expected): throw .wrongLength(found: found, expected: expected)
            case let .badCharacter(character, position): throw .badCharacter(character, position: position)
            case .checkMismatch: throw .checkMismatch
            }
        }
        guard let scalar = try? P256.Signing.PrivateKey(rawRepresentation: payload[GroupID.byteCount...]) else { throw .notAKey }
        self.init(groupID: GroupID(bytes: payload[..<GroupID.byteCount])!, key: DeviceKey(privateKey: scalar))
    }
}

/// Why a string is not a recovery code. One line each, saying what to do.
package enum RecoveryCodeParseError: Error, Hashable, CustomStringConvertible {
    case badPrefix
    case wrongLength(found: Int, expected: Int)
    case badCharacter(Character, position: Int)
    case checkMismatch
    case notAKey

    package var description: String {
        switch self {
        case .badPrefix:
            "invalid recovery code: it must start with PSR- (it was printed when the group was made, or by `peersync recovery new`)"
        case let .wrongLength(found, expected):
            "invalid recovery code: expected \(expected) characters after PSR-, found \(found) (was it cut off?)"
        case let .badCharacter(character, position):
            "invalid recovery code: \"\(character)\" at position \(position) is not one of its characters (0-9, A-Z without U)"
        case .checkMismatch:
            "invalid recovery code: check character does not match (a typo?)"
        case .notAKey:
            "invalid recovery code: its key part is not a valid key (a typo that kept the check character?)"
        }
    }
}
