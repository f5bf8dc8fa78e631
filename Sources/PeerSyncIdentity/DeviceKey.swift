import Crypto
@_spi(Engine) import PeerSyncCRDT

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A device's P-256 signing key: made once when a replica is created, kept in a file only its
/// owner can read, never sent anywhere. The public half and its ``DeviceID`` identify the device
/// in the roster and in TLS.
///
/// File format: PEM (`-----BEGIN PRIVATE KEY-----`, PKCS #8), written by ``create(at:)``.
/// ``load(from:)`` also reads a SEC1 PEM (`BEGIN EC PRIVATE KEY`), DER, or the raw 32-byte scalar.
package struct DeviceKey: Sendable {
    /// The private key. Never leaves the device.
    public let privateKey: P256.Signing.PrivateKey
    /// The public key and its device ID.
    public let publicKey: DevicePublicKey

    /// Wraps an existing key.
    public init(privateKey: P256.Signing.PrivateKey) {
        self.privateKey = privateKey
        publicKey = DevicePublicKey(privateKey.publicKey)
    }

    /// A new key from the system's secure random source (not stored anywhere).
    public static func generate() -> DeviceKey { DeviceKey(privateKey: P256.Signing.PrivateKey()) }

    /// This device's ID.
    public var deviceID: DeviceID { publicKey.deviceID }

    /// The PEM text ``create(at:)`` writes.
    public var pemRepresentation: String { privateKey.pemRepresentation }

    /// An ECDSA P-256 / SHA-256 signature of `message`, 64 bytes `r ‖ s` big-endian with
    /// `s ≤ n/2` (low-S), so nobody but the signer can make a second valid signature of the same
    /// message (the roster's record IDs hash the signature).
    public func signature(for message: some DataProtocol) -> [UInt8] {
        // Signing with a valid key over SHA-256 cannot fail in BoringSSL.
        let signature = try! privateKey.signature(for: message)
        return ECDSALowS.normalized(Array(signature.rawRepresentation))
    }

    // MARK: - Files

    /// Loads the key at `path`.
    ///
    /// - Throws: ``DeviceKeyError``: no file, permissions that let group or others read it (the
    ///   message names the `chmod 600` fix), not a regular file, unreadable, not a P-256 key.
    public static func load(from path: String) throws(DeviceKeyError) -> DeviceKey {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else {
            let code = errno
            if code == ENOENT { throw DeviceKeyError.missing(path: path) }
            throw DeviceKeyError.unreadable(path: path, reason: Self.describe(errno: code))
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw .unreadable(path: path, reason: Self.describe(errno: errno)) }
        guard info.st_mode & S_IFMT == S_IFREG else { throw .notAFile(path: path) }
        let mode = UInt32(info.st_mode) & 0o777
        guard mode & 0o077 == 0 else { throw .accessibleByOthers(path: path, mode: mode) }
        var contents: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                throw .unreadable(path: path, reason: Self.describe(errno: errno))
            }
            if n == 0 { break }
            contents += buffer[0..<n]
            guard contents.count <= 65_536 else { throw .corrupt(path: path, reason: "file is larger than 64 KiB") }
        }
        return try DeviceKey(fileContents: contents, path: path)
    }

    /// Parses a key file's contents (PEM, DER or raw 32 bytes).
    static func decode(_ contents: [UInt8]) -> P256.Signing.PrivateKey? {
        if contents.isEmpty { return nil }
        if let text = String(validating: contents, as: UTF8.self), text.contains("-----BEGIN") {
            return try? P256.Signing.PrivateKey(pemRepresentation: text)
        }
        if contents.count == 32 { return try? P256.Signing.PrivateKey(rawRepresentation: contents) }
        return try? P256.Signing.PrivateKey(derRepresentation: contents)
    }

    private init(fileContents: [UInt8], path: String) throws(DeviceKeyError) {
        guard !fileContents.isEmpty else { throw .corrupt(path: path, reason: "file is empty") }
        guard let key = Self.decode(fileContents) else {
            throw .corrupt(path: path, reason: "not a P-256 private key in PEM, DER or raw form")
        }
        self.init(privateKey: key)
    }

    /// Creates a new key and writes it to `path` (which must not exist) with mode 0600.
    ///
    /// The file is written under a temporary name created with mode 0600 (never wider, whatever
    /// the umask), synced, then linked to `path` in one step that fails if `path` appeared in the
    /// meantime; so a reader sees no file or the whole key, and two processes racing to create
    /// it end with one key.
    public static func create(at path: String) throws(DeviceKeyError) -> DeviceKey {
        let key = generate()
        try key.write(to: path)
        return key
    }

    /// Loads the key at `path`, or creates it if there is none. `created` says which.
    public static func loadOrCreate(at path: String) throws(DeviceKeyError) -> (key: DeviceKey, created: Bool) {
        do throws(DeviceKeyError) {
            return (try load(from: path), false)
        } catch .missing {
            do throws(DeviceKeyError) {
                return (try create(at: path), true)
            } catch .alreadyExists {
                return (try load(from: path), false) // another process created it first
            }
        }
    }

    /// Writes this key to a new file at `path` (mode 0600, atomically; fails if `path` exists).
    public func write(to path: String) throws(DeviceKeyError) {
        let directory = path.lastIndex(of: "/").map { path[..<$0].isEmpty ? "/" : String(path[..<$0]) } ?? "."
        var suffix = SystemRandomNumberGenerator()
        let temporary = path + ".tmp-" + String(suffix.next() as UInt64, radix: 16)
        let fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw .cannotCreate(path: path, reason: Self.describe(errno: errno)) }
        var failure: DeviceKeyError?
        let bytes = Array((pemRepresentation + (pemRepresentation.hasSuffix("\n") ? "" : "\n")).utf8)
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { posixWrite(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                failure = .cannotCreate(path: path, reason: Self.describe(errno: errno))
                break
            }
            offset += n
        }
        if failure == nil, fsync(fd) != 0 { failure = .cannotCreate(path: path, reason: Self.describe(errno: errno)) }
        close(fd)
        if failure == nil, link(temporary, path) != 0 {
            let code = errno
            failure = code == EEXIST ? .alreadyExists(path: path) : .cannotCreate(path: path, reason: Self.describe(errno: code))
        }
        unlink(temporary)
        if let failure { throw failure }
        let directoryFD = open(directory, O_RDONLY | O_CLOEXEC)
        if directoryFD >= 0 {
            _ = fsync(directoryFD)
            close(directoryFD)
        }
    }

    static func describe(errno code: Int32) -> String {
        String(cString: strerror(code))
    }
}

/// `write(2)`, named apart from ``DeviceKey/write(to:)``.
@inline(__always)
private func posixWrite(_ fd: Int32, _ buffer: UnsafeRawPointer?, _ count: Int) -> Int {
    write(fd, buffer, count)
}

/// Why a device key file cannot be used. Each description is one line naming the file and what to do.
package enum DeviceKeyError: Error, Equatable, CustomStringConvertible {
    case missing(path: String)
    case accessibleByOthers(path: String, mode: UInt32)
    case notAFile(path: String)
    case unreadable(path: String, reason: String)
    case corrupt(path: String, reason: String)
    case alreadyExists(path: String)
    case cannotCreate(path: String, reason: String)

    public var description: String {
        switch self {
        case .missing(let path):
            "device key \(path) does not exist (is this the right store directory?)"
        case let .accessibleByOthers(path, mode):
            "device key \(path) can be read by other users (mode \(String(mode, radix: 8))); run `chmod 600 \(path)` and retry"
        case .notAFile(let path):
            "device key \(path) is not a regular file"
        case let .unreadable(path, reason):
            "cannot read device key \(path): \(reason)"
        case let .corrupt(path, reason):
            "device key \(path) is damaged (\(reason)); restore it from a backup, or move it away to make this a new device"
        case .alreadyExists(let path):
            "device key \(path) already exists; refusing to overwrite it"
        case let .cannotCreate(path, reason):
            "cannot create device key \(path): \(reason)"
        }
    }
}

/// A device's public key with its device ID; compares by key bytes.
package struct DevicePublicKey: Hashable, Sendable, CustomStringConvertible {
    /// The key.
    public let key: P256.Signing.PublicKey
    /// SEC1 uncompressed point `04 ‖ X ‖ Y` (65 bytes): the form roster entries carry.
    public let x963: [UInt8]
    /// The key's fingerprint.
    public let deviceID: DeviceID

    /// Wraps `key`, computing its uncompressed form and device ID.
    public init(_ key: P256.Signing.PublicKey) {
        self.key = key
        x963 = Array(key.x963Representation)
        deviceID = DeviceID(publicKey: key)
    }

    /// A key from its 65-byte uncompressed form; nil unless it is a point on P-256.
    public init?(x963: some Collection<UInt8>) {
        guard x963.count == 65, x963.first == 4, let key = try? P256.Signing.PublicKey(x963Representation: Array(x963)) else {
            return nil
        }
        self.init(key)
    }

    /// Whether `signature` (64 bytes, low-S) signs `message` with this key.
    public func isValidSignature(_ signature: some Collection<UInt8>, for message: some DataProtocol) -> Bool {
        guard signature.count == 64, ECDSALowS.isLow(Array(signature)),
              let parsed = try? P256.Signing.ECDSASignature(rawRepresentation: Array(signature))
        else { return false }
        return key.isValidSignature(parsed, for: message)
    }

    public static func == (lhs: DevicePublicKey, rhs: DevicePublicKey) -> Bool { lhs.x963 == rhs.x963 }
    public func hash(into hasher: inout Hasher) { hasher.combine(x963) }
    public var description: String { deviceID.description }
}

/// ECDSA signatures with `s ≤ n/2`: (r, s) and (r, n − s) both verify, so accepting only the
/// low one makes a signature unique to its signer's choice (no third-party malleability).
enum ECDSALowS {
    /// The order n of P-256's base point, big-endian.
    static let order: [UInt8] = [
        0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xbc, 0xe6, 0xfa, 0xad, 0xa7, 0x17, 0x9e, 0x84, 0xf3, 0xb9, 0xca, 0xc2, 0xfc, 0x63, 0x25, 0x51,
    ]
    /// ⌊n / 2⌋, big-endian.
    static let halfOrder: [UInt8] = [
        0x7f, 0xff, 0xff, 0xff, 0x80, 0x00, 0x00, 0x00, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        0xde, 0x73, 0x7d, 0x56, 0xd3, 0x8b, 0xcf, 0x42, 0x79, 0xdc, 0xe5, 0x61, 0x7e, 0x31, 0x92, 0xa8,
    ]

    /// Whether the `s` half of a raw 64-byte signature is at most n/2.
    static func isLow(_ raw: [UInt8]) -> Bool {
        !halfOrder.lexicographicallyPrecedes(raw[32..<64])
    }

    /// `raw` with `s` replaced by `n − s` if `s > n/2`.
    static func normalized(_ raw: [UInt8]) -> [UInt8] {
        guard raw.count == 64, !isLow(raw) else { return raw }
        var result = Array(raw[0..<32])
        var s = [UInt8](repeating: 0, count: 32)
        var borrow = 0
        for i in stride(from: 31, through: 0, by: -1) {
            var digit = Int(order[i]) - Int(raw[32 + i]) - borrow
            borrow = digit < 0 ? 1 : 0
            if digit < 0 { digit += 256 }
            s[i] = UInt8(digit)
        }
        result += s
        return result
    }
}
