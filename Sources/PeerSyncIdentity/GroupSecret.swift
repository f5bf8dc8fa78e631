import Crypto
@_spi(Engine) import PeerSyncCRDT

/// The secret of a sync group. Only devices that know it can connect; it is shared as an
/// invite code a person can type or paste:
///
/// ```
/// PS1-XXXX-XXXX-XXXX-XXXX-XXXX-XXXX-XXXX-XXXX-C
/// ```
/// 32 Crockford base32 characters carry 160 random bits; `C` is a check character (the
/// 160-bit number mod 37) that catches typos. Case, dashes and spaces do not matter; `I`/`L` read
/// as `1`, `O` as `0`.
///
/// Everything else is derived with HKDF-SHA256 (salt "peersync v1"): the TLS pre-shared key and
/// the opaque discovery tag (which reveals nothing about the secret or any group name).
package struct GroupSecret: Sendable, Equatable {
    public static let byteCount = 20
    public let bytes: [UInt8]

    public init(bytes: [UInt8]) {
        precondition(bytes.count == Self.byteCount, "a group secret has \(Self.byteCount) bytes")
        self.bytes = bytes
    }

    /// A new random secret.
    public static func generate() -> GroupSecret {
        var generator = SystemRandomNumberGenerator()
        return GroupSecret(bytes: (0..<byteCount).map { _ in UInt8.random(in: 0...255, using: &generator) })
    }

    static let alphabet = Array("0123456789ABCDEFGHJKMNPQRSTVWXYZ")
    static let checkAlphabet = Array("0123456789ABCDEFGHJKMNPQRSTVWXYZ*~$=U")

    /// The invite code a person types or pastes.
    public var inviteCode: String {
        var bits = 0
        var value = 0
        var chars: [Character] = []
        for byte in bytes {
            value = (value << 8) | Int(byte)
            bits += 8
            while bits >= 5 {
                bits -= 5
                chars.append(Self.alphabet[(value >> bits) & 31])
            }
        }
        let groups = stride(from: 0, to: chars.count, by: 4).map { String(chars[$0..<min($0 + 4, chars.count)]) }
        return "PS1-" + groups.joined(separator: "-") + "-" + String(Self.checkAlphabet[checksum])
    }

    private var checksum: Int {
        bytes.reduce(0) { ($0 * 256 + Int($1)) % 37 }
    }

    /// Parses an invite code; the error says what is wrong with it.
    public init(inviteCode: String) throws(InviteCodeError) {
        var text = inviteCode.uppercased().filter { !$0.isWhitespace && $0 != "-" }
        guard text.hasPrefix("PS1") else { throw .badPrefix }
        text.removeFirst(3)
        guard text.count == 33 else { throw .wrongLength(text.count) }
        var value = 0
        var bits = 0
        var bytes: [UInt8] = []
        for ch in text.prefix(32) {
            let normalized: Character = switch ch {
            case "I", "L": "1"
            case "O": "0"
            default: ch
            }
            guard let digit = Self.alphabet.firstIndex(of: normalized) else { throw .badCharacter(ch) }
            value = (value << 5) | digit
            bits += 5
            if bits >= 8 {
                bits -= 8
                bytes.append(UInt8((value >> bits) & 0xff))
            }
        }
        let secret = GroupSecret(bytes: bytes)
        guard Self.checkAlphabet.firstIndex(of: text.last!) == secret.checksum else { throw .checksumMismatch }
        self = secret
    }

    func derive(_ info: String, count: Int) -> [UInt8] {
        let key = HKDF<SHA256>.deriveKey(
            inputKeyMaterial: SymmetricKey(data: bytes), salt: Array("peersync v1".utf8),
            info: Array(info.utf8), outputByteCount: count)
        return key.withUnsafeBytes { Array($0) }
    }

    /// 32-byte key for TLS-PSK.
    package var preSharedKey: [UInt8] { derive("tls psk", count: 32) }

    /// An opaque tag that lets members find each other in DNS-SD; 16 hex digits.
    public var groupTag: String {
        derive("discovery tag", count: 8).map { byte in
            let s = String(byte, radix: 16)
            return s.count == 1 ? "0" + s : s
        }.joined()
    }
}

/// Why a string is not an invite code.
package enum InviteCodeError: Error, Equatable, CustomStringConvertible {
    case badPrefix
    case wrongLength(Int)
    case badCharacter(Character)
    case checksumMismatch

    public var description: String {
        switch self {
        case .badPrefix: "invalid invite code: it must start with PS1- (get one with `peersync invite` on a member)"
        case .wrongLength(let n): "invalid invite code: expected 33 characters after PS1-, found \(n) (was it cut off?)"
        case .badCharacter(let c): "invalid invite code: \"\(c)\" is not one of its characters (0-9, A-Z without I, L, O, U)"
        case .checksumMismatch: "invalid invite code: check character does not match (a typo?)"
        }
    }
}
