import Crypto
import Foundation
@_spi(Engine) import PeerSyncCRDT
@testable import PeerSyncIdentity
import PeerSyncTestSupport
import Testing
import X509

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A fresh directory under the system's temporary directory, removed by `cleanup()`.
struct TemporaryDirectory {
    let path: String

    init() throws {
        path = NSTemporaryDirectory() + "peersync-identity-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }

    func cleanup() { try? FileManager.default.removeItem(atPath: path) }
}

func fileMode(_ path: String) throws -> UInt32 {
    var info = stat()
    guard stat(path, &info) == 0 else { throw MissingValue(description: "stat \(path) failed") }
    return UInt32(info.st_mode) & 0o777
}

@Suite("Identity: device keys")
struct DeviceKeyTests {
    @Test("a new key file has mode 0600 and loads back as the same key")
    func createdPrivate() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let path = dir.path + "/device-key.pem"
        let oldMask = umask(0) // the widest umask: the file must still be 0600
        let created = Result { () throws(DeviceKeyError) -> DeviceKey in try DeviceKey.create(at: path) }
        umask(oldMask)
        let key = try created.get()
        #expect(try fileMode(path) == 0o600)
        let loaded = try DeviceKey.load(from: path)
        #expect(loaded.deviceID == key.deviceID)
        #expect(try String(contentsOfFile: path, encoding: .utf8).hasPrefix("-----BEGIN PRIVATE KEY-----"))
        // No temporary file is left behind.
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir.path) == ["device-key.pem"])
    }

    @Test("a key file readable by others is refused with the path and the chmod fix")
    func tooOpen() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let path = dir.path + "/device-key.pem"
        _ = try DeviceKey.create(at: path)
        chmod(path, 0o644)
        #expect(throws: DeviceKeyError.accessibleByOthers(path: path, mode: 0o644)) { try DeviceKey.load(from: path) }
        do {
            _ = try DeviceKey.load(from: path)
        } catch {
            #expect(error.description == "device key \(path) can be read by other users (mode 644); run `chmod 600 \(path)` and retry")
        }
        chmod(path, 0o640)
        #expect(throws: DeviceKeyError.accessibleByOthers(path: path, mode: 0o640)) { try DeviceKey.load(from: path) }
        chmod(path, 0o400)
        #expect(try DeviceKey.load(from: path).deviceID == DeviceKey.load(from: path).deviceID)
    }

    @Test("missing, empty, corrupt and directory paths give clear errors")
    func badFiles() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let missing = dir.path + "/nope.key"
        #expect(throws: DeviceKeyError.missing(path: missing)) { try DeviceKey.load(from: missing) }
        let corrupt = dir.path + "/corrupt.key"
        _ = FileManager.default.createFile(atPath: corrupt, contents: Data("-----BEGIN PRIVATE KEY-----\nAAAA\n".utf8),
                                       attributes: [.posixPermissions: 0o600])
        #expect(throws: DeviceKeyError.corrupt(path: corrupt, reason: "not a P-256 private key in PEM, DER or raw form")) {
            try DeviceKey.load(from: corrupt)
        }
        let empty = dir.path + "/empty.key"
        _ = FileManager.default.createFile(atPath: empty, contents: Data(), attributes: [.posixPermissions: 0o600])
        #expect(throws: DeviceKeyError.corrupt(path: empty, reason: "file is empty")) { try DeviceKey.load(from: empty) }
        let directory = dir.path + "/adir"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false,
                                                attributes: [.posixPermissions: 0o700])
        #expect(throws: DeviceKeyError.notAFile(path: directory)) { try DeviceKey.load(from: directory) }
        #expect(throws: DeviceKeyError.self) { try DeviceKey.create(at: dir.path + "/no/such/dir/key") }
    }

    @Test("create refuses to overwrite; loadOrCreate creates once and then loads")
    func noOverwrite() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let path = dir.path + "/device-key.pem"
        let (first, created) = try DeviceKey.loadOrCreate(at: path)
        #expect(created)
        #expect(throws: DeviceKeyError.alreadyExists(path: path)) { try DeviceKey.create(at: path) }
        let (second, createdAgain) = try DeviceKey.loadOrCreate(at: path)
        #expect(!createdAgain)
        #expect(second.deviceID == first.deviceID)
    }

    @Test("raw 32-byte, DER and SEC1 PEM key files load")
    func otherFormats() throws {
        let dir = try TemporaryDirectory()
        defer { dir.cleanup() }
        let key = P256.Signing.PrivateKey()
        let forms: [(String, Data)] = [
            ("raw", key.rawRepresentation), ("der", key.derRepresentation),
            ("sec1", Data(key.x963Representation)) // not a supported form: must fail cleanly
        ]
        for (name, contents) in forms {
            let path = dir.path + "/" + name
            _ = FileManager.default.createFile(atPath: path, contents: contents, attributes: [.posixPermissions: 0o600])
            if name == "sec1" {
                #expect(throws: DeviceKeyError.self) { try DeviceKey.load(from: path) }
            } else {
                #expect(try DeviceKey.load(from: path).deviceID == DeviceKey(privateKey: key).deviceID)
            }
        }
    }

    @Test("signatures are low-S and verify; a high-S twin is refused")
    func lowS() throws {
        let key = DeviceKey.generate()
        for i in 0..<64 {
            let message = Array("message \(i)".utf8)
            let signature = key.signature(for: message)
            #expect(ECDSALowS.isLow(signature))
            #expect(key.publicKey.isValidSignature(signature, for: message))
            // (r, n − s) verifies in plain ECDSA but is not accepted here.
            var highS = [UInt8](repeating: 0, count: 32)
            var borrow = 0
            for j in stride(from: 31, through: 0, by: -1) {
                var digit = Int(ECDSALowS.order[j]) - Int(signature[32 + j]) - borrow
                borrow = digit < 0 ? 1 : 0
                if digit < 0 { digit += 256 }
                highS[j] = UInt8(digit)
            }
            let highSignature = Array(signature[0..<32]) + highS
            let plain = try P256.Signing.ECDSASignature(rawRepresentation: highSignature)
            #expect(key.privateKey.publicKey.isValidSignature(plain, for: message))
            #expect(!key.publicKey.isValidSignature(highSignature, for: message))
        }
    }
}

@Suite("Identity: device IDs")
struct DeviceIDTests {
    static let vectorScalar: [UInt8] = Array(SHA256.hash(data: Array("peersync test vector".utf8)))

    @Test("the device ID is SHA-256 of the SubjectPublicKeyInfo, first 20 bytes, in base32 (independent vector)")
    func vector() throws {
        // Computed with Python's `cryptography` package, not with this code.
        let key = DeviceKey(privateKey: try P256.Signing.PrivateKey(rawRepresentation: Self.vectorScalar))
        #expect(key.deviceID.humanForm == "NB9B-B049-AWE0-YNR2-EZNV-ETKP-SQ0T-BKT6")
        #expect(key.deviceID.shortForm == "NB9B")
        #expect(key.privateKey.publicKey.derRepresentation.count == 91)
        // Stable: the same key gives the same ID through every path.
        #expect(DeviceID(publicKey: key.privateKey.publicKey) == key.deviceID)
        #expect(DevicePublicKey(x963: key.publicKey.x963)?.deviceID == key.deviceID)
        let compressed = try P256.Signing.PublicKey(compressedRepresentation: key.privateKey.publicKey.compressedRepresentation)
        #expect(DeviceID(publicKey: compressed) == key.deviceID)
    }

    @Test("the human form round-trips and tolerates case, spaces, dashes and I/L/O")
    func humanForm() throws {
        for _ in 0..<50 {
            let id = DeviceKey.generate().deviceID
            let text = id.humanForm
            #expect(text.count == 39)
            #expect(try DeviceID(parsing: text) == id)
            #expect(try DeviceID(parsing: text.lowercased()) == id)
            #expect(try DeviceID(parsing: text.replacingOccurrences(of: "-", with: "")) == id)
            #expect(try DeviceID(parsing: text.replacingOccurrences(of: "-", with: " ")) == id)
            let confusable = text.replacingOccurrences(of: "1", with: "l").replacingOccurrences(of: "0", with: "O")
            #expect(try DeviceID(parsing: confusable) == id)
        }
    }

    @Test("bad device IDs say where and what")
    func parseErrors() {
        #expect(throws: DeviceIDParseError.badCharacter("U", position: 6)) { try DeviceID(parsing: "NB9B-UO49-AWE0-YNR2-EZNV-ETKP-SQ0T-BKT6") }
        #expect(throws: DeviceIDParseError.wrongLength(found: 31)) { try DeviceID(parsing: "NB9B-B049-AWE0-YNR2-EZNV-ETKP-SQ0T-BKT") }
        #expect(throws: DeviceIDParseError.wrongLength(found: 33)) { try DeviceID(parsing: "NB9B-B049-AWE0-YNR2-EZNV-ETKP-SQ0T-BKT66") }
        #expect(DeviceIDParseError.badCharacter("U", position: 6).description
            == "invalid device ID: \"U\" at position 6 is not one of its characters (0-9, A-Z without U)")
    }

    @Test("device IDs order bytewise")
    func ordering() {
        let low = DeviceID(bytes: [UInt8](repeating: 0, count: 19) + [1])!
        let high = DeviceID(bytes: [1] + [UInt8](repeating: 0, count: 19))!
        #expect(low < high)
        #expect(DeviceID(bytes: [1, 2, 3]) == nil)
    }

    @Test("a device certificate carries the device key: same device ID, CN = human form")
    func certificate() throws {
        let key = DeviceKey.generate()
        let certificate = try DeviceCertificate.make(key: key, deviceName: "Ana's laptop")
        #expect(certificate.deviceID == key.deviceID)
        #expect(try DeviceID(certificateDER: certificate.derBytes) == key.deviceID)
        let parsed = try Certificate(derEncoded: certificate.derBytes)
        #expect(parsed.subject.description.contains("CN=\(key.deviceID.humanForm)"))
        #expect(parsed.issuer == parsed.subject)
        #expect(parsed.notValidAfter.timeIntervalSinceNow > 9 * 365 * 86_400)
        #expect(parsed.notValidBefore < Date())
        // Another key gives another ID; garbage is not a certificate.
        #expect(try DeviceID(certificateDER: DeviceCertificate.make(key: .generate()).derBytes) != key.deviceID)
        #expect(throws: DeviceIDError.self) { try DeviceID(certificateDER: [0x30, 0x03, 0x02, 0x01, 0x01]) }
    }
}

@Suite("Identity: invite codes")
struct InviteCodeTests {
    func sample() -> InviteCode {
        InviteCode(groupID: GroupID(bytes: (0..<16).map { UInt8($0 * 7) })!, inviter: DeviceKey.generate().deviceID,
                   token: .generate())
    }

    @Test("an invite code round-trips and tolerates case, spaces, dashes and I/L/O")
    func roundTrip() throws {
        for _ in 0..<50 {
            let code = sample()
            let text = code.text
            #expect(text.hasPrefix("PS2-"))
            #expect(text.count == 4 + 84 + 20 + 2)
            #expect(try InviteCode(parsing: text) == code)
            #expect(try InviteCode(parsing: text.lowercased()) == code)
            #expect(try InviteCode(parsing: "  " + text.replacingOccurrences(of: "-", with: " ") + "\n") == code)
            let body = String(text.dropFirst(4))
            let confusable = body.replacingOccurrences(of: "1", with: "L").replacingOccurrences(of: "0", with: "o")
            #expect(try InviteCode(parsing: "PS2-" + confusable) == code)
        }
    }

    @Test("bad invite codes say what is wrong")
    func errors() throws {
        let text = sample().text
        #expect(throws: InviteCodeParseError.oldStyleGroupSecret) { try InviteCode(parsing: "PS1-ABCD-EFGH") }
        #expect(throws: InviteCodeParseError.badPrefix) { try InviteCode(parsing: "PS3-" + text.dropFirst(4)) }
        #expect(throws: InviteCodeParseError.wrongLength(found: 84, expected: 85)) { try InviteCode(parsing: String(text.dropLast(2))) }
        var chars = Array(text)
        chars[5] = "U"
        #expect(throws: InviteCodeParseError.badCharacter("U", position: 6)) { try InviteCode(parsing: String(chars)) }
        // One changed data character: the check character catches it.
        chars = Array(text)
        chars[5] = chars[5] == "7" ? "8" : "7"
        #expect(throws: InviteCodeParseError.checkMismatch) { try InviteCode(parsing: String(chars)) }
        #expect(InviteCodeParseError.checkMismatch.description == "invalid invite code: check character does not match (a typo?)")
        #expect(InviteCodeParseError.oldStyleGroupSecret.description.contains("old-style group secret"))
    }

    @Test("the check character is the payload mod 37")
    func checkCharacter() {
        let code = InviteCode(groupID: GroupID(bytes: [UInt8](repeating: 0, count: 16))!,
                              inviter: DeviceID(bytes: [UInt8](repeating: 0, count: 20))!,
                              token: InviteToken(bytes: [UInt8](repeating: 0, count: 15) + [40])!)
        // 40 mod 37 = 3; the last data character carries the token's low bits.
        #expect(code.text.hasSuffix("-3"))
        #expect(code.text.hasPrefix("PS2-0000-0000"))
    }
}
