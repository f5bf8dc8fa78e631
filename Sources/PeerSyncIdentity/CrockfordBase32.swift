/// Crockford base32 as PeerSync shows it to people (device IDs, invite codes, docs/PROTOCOL.md §8):
/// digits `0-9 A-Z` without `I L O U`, 5 bits a character, most significant bits first; the last
/// character is padded with zero bits. Readers ignore case, spaces and dashes, and read `I`/`L`
/// as `1` and `O` as `0`.
enum CrockfordBase32 {
    static let alphabet: [Character] = Array("0123456789ABCDEFGHJKMNPQRSTVWXYZ")
    /// Check characters: the 32 digits and `* ~ $ = U` for the values 32–36 (value mod 37).
    static let checkAlphabet: [Character] = Array("0123456789ABCDEFGHJKMNPQRSTVWXYZ*~$=U")

    /// Number of characters for `byteCount` bytes.
    static func characterCount(forBytes byteCount: Int) -> Int { (byteCount * 8 + 4) / 5 }

    /// `bytes` as base32 characters (no separators).
    static func encode(_ bytes: some Sequence<UInt8>) -> [Character] {
        var chars: [Character] = []
        var value = 0
        var bits = 0
        for byte in bytes {
            value = (value << 8 | Int(byte)) & 0xfff
            bits += 8
            while bits >= 5 {
                bits -= 5
                chars.append(alphabet[(value >> bits) & 31])
            }
        }
        if bits > 0 { chars.append(alphabet[(value << (5 - bits)) & 31]) }
        return chars
    }

    /// The value of one character, or nil if it is not a base32 digit. Case-insensitive;
    /// `I`/`L` read as 1, `O` as 0.
    static func value(of character: Character) -> Int? {
        let upper: Character = switch character {
        case "i", "I", "l", "L": "1"
        case "o", "O": "0"
        default: Character(character.uppercased())
        }
        return alphabet.firstIndex(of: upper)
    }

    /// Decodes exactly `byteCount` bytes from `values` (5 bits each); nil if the count is wrong or
    /// the padding bits of the last character are not zero.
    static func decode(values: [Int], byteCount: Int) -> [UInt8]? {
        guard values.count == characterCount(forBytes: byteCount) else { return nil }
        var bytes: [UInt8] = []
        bytes.reserveCapacity(byteCount)
        var value = 0
        var bits = 0
        for digit in values {
            value = (value << 5 | digit) & 0xfff
            bits += 5
            if bits >= 8 {
                bits -= 8
                bytes.append(UInt8((value >> bits) & 0xff))
            }
        }
        guard bytes.count == byteCount, value & ((1 << bits) - 1) == 0 else { return nil }
        return bytes
    }

    /// `characters` in groups of four joined by `-`.
    static func grouped(_ characters: [Character]) -> String {
        stride(from: 0, to: characters.count, by: 4)
            .map { String(characters[$0..<min($0 + 4, characters.count)]) }
            .joined(separator: "-")
    }

    /// `bytes` read as one big-endian integer, mod 37.
    static func mod37(_ bytes: some Sequence<UInt8>) -> Int {
        bytes.reduce(0) { ($0 * 256 + Int($1)) % 37 }
    }
}

/// What is wrong with a typed code (an invite's, a recovery code's): each kind of code turns it
/// into its own error.
enum CodeTextFailure: Error {
    /// The first three characters are not the code's prefix; `found` is what they are.
    case badPrefix(found: String)
    case wrongLength(found: Int, expected: Int)
    case badCharacter(Character, position: Int)
    case checkMismatch
}

extension CrockfordBase32 {
    /// The payload of a code typed as `PREFIX-` ‖ base32 of `byteCount` bytes ‖ a check
    /// character (PROTOCOL §12): separators, case and `I`/`L`/`O` folded as readers must.
    static func payload(ofCode text: String, prefix: String, byteCount: Int) throws(CodeTextFailure) -> [UInt8] {
        let typed = TypedCharacters(text).characters
        let head = String(typed.prefix(3).map(\.character)).uppercased()
        guard head == prefix else { throw .badPrefix(found: head) }
        let rest = typed.dropFirst(3)
        let dataCharacters = characterCount(forBytes: byteCount)
        guard rest.count == dataCharacters + 1 else { throw .wrongLength(found: rest.count, expected: dataCharacters + 1) }
        var values: [Int] = []
        for (character, position) in rest.prefix(dataCharacters) {
            guard let value = value(of: character) else { throw .badCharacter(character, position: position) }
            values.append(value)
        }
        let (checkCharacter, checkPosition) = rest.last!
        let upper = Character(checkCharacter.uppercased())
        guard let check = checkAlphabet.firstIndex(of: upper) ?? value(of: checkCharacter) else {
            throw .badCharacter(checkCharacter, position: checkPosition)
        }
        guard let payload = decode(values: values, byteCount: byteCount), mod37(payload) == check else { throw .checkMismatch }
        return payload
    }

    /// `payload` as a code: `PREFIX-`, the base32 in groups of four, `-`, the check character.
    static func code(prefix: String, payload: [UInt8]) -> String {
        prefix + "-" + grouped(encode(payload)) + "-" + String(checkAlphabet[mod37(payload)])
    }
}

/// Characters a person typed, without the separators readers ignore, each with its 1-based
/// position in the original text (for error messages).
struct TypedCharacters {
    var characters: [(character: Character, position: Int)] = []

    init(_ text: String) {
        for (offset, character) in text.enumerated() where !(character.isWhitespace || character == "-") {
            characters.append((character, offset + 1))
        }
    }
}
