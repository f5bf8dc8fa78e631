/// What a new device needs to join a group once, as text a person can paste or type:
///
/// ```
/// PS2-XXXX-XXXX-…-XXXX-C
/// ```
/// `PS2-`, then 84 Crockford base32 characters of 52 bytes — group ID (16) ‖ inviter's device ID
/// (20) ‖ token (16) — in groups of 4, then `-` and a check character: the 52 bytes as one
/// big-endian integer mod 37, from `0123456789ABCDEFGHJKMNPQRSTVWXYZ*~$=U`. Readers ignore case,
/// spaces and dashes and read `I`/`L` as `1`, `O` as `0`.
///
/// The inviter's device ID lets the joiner authenticate the device it first connects to (its TLS
/// certificate must have that fingerprint). The token is single-use: the roster publishes only
/// its hash (``InviteToken/hash``) and the joiner reveals it once in its `enrol` entry. Nothing in
/// the code decrypts anything: sessions use ephemeral keys, so a code (used or not) does not
/// open recorded traffic.
public struct InviteCode: Hashable, Sendable, CustomStringConvertible {
    /// The group to join.
    package let groupID: GroupID
    /// The admin device that made the invite: the joiner's first peer must be this device.
    public let inviter: DeviceID
    /// The single-use secret the joiner reveals in its enrol entry.
    package let token: InviteToken

    static let prefix = "PS2"
    static let payloadBytes = GroupID.byteCount + DeviceID.byteCount + InviteToken.byteCount

    /// A code from its parts (``text`` renders it).
    package init(groupID: GroupID, inviter: DeviceID, token: InviteToken) {
        self.groupID = groupID
        self.inviter = inviter
        self.token = token
    }

    var payload: [UInt8] { groupID.bytes + inviter.bytes + token.bytes }

    /// The code as text.
    public var text: String { CrockfordBase32.code(prefix: Self.prefix, payload: payload) }

    public var description: String { text }

    /// Parses a code; the error says what is wrong (and recognises an old `PS1-` group secret).
    public init(parsing text: String) throws(InviteCodeParseError) {
        let payload: [UInt8]
        do {
            payload = try CrockfordBase32.payload(ofCode: text, prefix: Self.prefix, byteCount: Self.payloadBytes)
        } catch {
            switch error {
            case .badPrefix(let found): throw found == "PS1" ? .oldStyleGroupSecret : .badPrefix
            case let .wrongLength(found, expected): throw .wrongLength(found: found, expected: expected)
            case let .badCharacter(character, position): throw .badCharacter(character, position: position)
            case .checkMismatch: throw .checkMismatch
            }
        }
        let groupEnd = GroupID.byteCount
        let inviterEnd = groupEnd + DeviceID.byteCount
        self.init(groupID: GroupID(bytes: payload[..<groupEnd])!, inviter: DeviceID(bytes: payload[groupEnd..<inviterEnd])!,
                  token: InviteToken(bytes: payload[inviterEnd...])!)
    }
}

/// Why a string is not an invite code. One line each, saying what to do.
public enum InviteCodeParseError: Error, Hashable, CustomStringConvertible {
    case badPrefix
    case oldStyleGroupSecret
    case wrongLength(found: Int, expected: Int)
    case badCharacter(Character, position: Int)
    case checkMismatch

    public var description: String {
        switch self {
        case .badPrefix:
            "invalid invite code: it must start with PS2- (make one with `peersync invite` on an admin's device)"
        case .oldStyleGroupSecret:
            "this is an old-style group secret (PS1-), not an invite: it is used to upgrade a group from a shared secret"
        case let .wrongLength(found, expected):
            "invalid invite code: expected \(expected) characters after PS2-, found \(found) (was it cut off?)"
        case let .badCharacter(character, position):
            "invalid invite code: \"\(character)\" at position \(position) is not one of its characters (0-9, A-Z without U)"
        case .checkMismatch:
            "invalid invite code: check character does not match (a typo?)"
        }
    }
}
