import Crypto
@_spi(Engine) import PeerSyncCRDT
import SwiftASN1
import X509

/// The identity of one device: a fingerprint of its public key, in a form people compare aloud.
///
/// The 160 bits are the first 20 bytes of SHA-256 over the key's DER SubjectPublicKeyInfo in
/// the canonical form for P-256 (uncompressed point, 91 bytes: what
/// `P256.Signing.PublicKey.derRepresentation` gives). A key sent compressed or in another
/// encoding is decoded and re-encoded first, so one key has exactly one device ID.
///
/// Human form: 32 Crockford base32 characters in 8 groups of 4 (``humanForm``), e.g.
/// `MFZW-Q2LT-8H3C-0X7K-…`; ``shortForm`` (the first group) is for log lines. Parsing ignores
/// case, spaces and dashes and reads `I`/`L` as `1` and `O` as `0`.
public struct DeviceID: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// Bytes in a device ID.
    public static let byteCount = 20

    /// The 20 fingerprint bytes.
    public let bytes: [UInt8]

    /// A device ID from its 20 bytes; nil for any other count.
    public init?(bytes: some Collection<UInt8>) {
        guard bytes.count == Self.byteCount else { return nil }
        self.bytes = Array(bytes)
    }

    /// The device ID of `publicKey`.
    public init(publicKey: P256.Signing.PublicKey) {
        bytes = Array(SHA256.hash(data: publicKey.derRepresentation).prefix(Self.byteCount))
    }

    /// The device ID of the P-256 key in a DER X.509 certificate (as TLS presents it).
    ///
    /// Only the key counts: the subject name and every other field are ignored, and the
    /// certificate's own signature is not checked (TLS proves the peer holds the private key).
    package init(certificateDER: [UInt8]) throws(DeviceIDError) {
        self = try DevicePublicKey(certificateDER: certificateDER).deviceID
    }

    /// The device ID of the P-256 key of `certificate`.
    ///
    /// (``DevicePublicKey/init(certificateDER:)`` gives the key itself.)
    package init(certificate: Certificate) throws(DeviceIDError) {
        guard let key = P256.Signing.PublicKey(certificate.publicKey) else {
            throw .notP256
        }
        self.init(publicKey: key)
    }

    /// Parses the human form; the error says what is wrong and where.
    package init(parsing text: String) throws(DeviceIDParseError) {
        let typed = TypedCharacters(text)
        let expected = CrockfordBase32.characterCount(forBytes: Self.byteCount)
        var values: [Int] = []
        for (character, position) in typed.characters {
            guard let value = CrockfordBase32.value(of: character) else {
                throw .badCharacter(character, position: position)
            }
            values.append(value)
        }
        guard values.count == expected, let bytes = CrockfordBase32.decode(values: values, byteCount: Self.byteCount) else {
            throw .wrongLength(found: values.count)
        }
        self.bytes = bytes
    }

    /// 32 base32 characters in 8 groups of 4: `XXXX-XXXX-XXXX-XXXX-XXXX-XXXX-XXXX-XXXX`.
    public var humanForm: String { CrockfordBase32.grouped(CrockfordBase32.encode(bytes)) }

    /// The first group of the human form (20 bits), for logs and tables. Not unique enough to
    /// identify a device by; compare ``humanForm`` for that.
    public var shortForm: String { String(CrockfordBase32.encode(bytes.prefix(3)).prefix(4)) }

    public var description: String { humanForm }

    public static func < (lhs: DeviceID, rhs: DeviceID) -> Bool { lhs.bytes.lexicographicallyPrecedes(rhs.bytes) }
}

/// Why a certificate yields no device ID.
package enum DeviceIDError: Error, Equatable, CustomStringConvertible {
    case notACertificate(String)
    case notP256

    public var description: String {
        switch self {
        case .notACertificate(let detail): "peer certificate is not a valid X.509 certificate: \(detail)"
        case .notP256: "peer certificate does not carry a P-256 key; not a PeerSync device"
        }
    }
}

/// Why a string is not a device ID.
package enum DeviceIDParseError: Error, Equatable, CustomStringConvertible {
    case badCharacter(Character, position: Int)
    case wrongLength(found: Int)

    public var description: String {
        switch self {
        case let .badCharacter(character, position):
            "invalid device ID: \"\(character)\" at position \(position) is not one of its characters (0-9, A-Z without U)"
        case let .wrongLength(found):
            "invalid device ID: expected 32 characters (8 groups of 4), found \(found)"
        }
    }
}

extension DevicePublicKey {
    /// The P-256 key a DER certificate certifies (a relay's, read from its TLS certificate).
    package init(certificateDER: [UInt8]) throws(DeviceIDError) {
        let certificate: Certificate
        do {
            certificate = try Certificate(derEncoded: certificateDER)
        } catch {
            throw .notACertificate("\(error)")
        }
        guard let key = P256.Signing.PublicKey(certificate.publicKey) else { throw .notP256 }
        self.init(key)
    }
}
