import Crypto
@_spi(Engine) import PeerSyncCRDT

/// The identity of a sync group: 128 bits.
///
/// A group made with `peersync init` has the ID of its genesis entry (the first 16 bytes of
/// SHA-256 over the signed genesis entry's bytes); a group upgraded from a shared group secret
/// has the first 16 bytes of its legacy key's device ID (``LegacyGroupKey``).
package struct GroupID: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// Bytes in the value.
    public static let byteCount = 16
    /// The raw bytes.
    public let bytes: [UInt8]

    /// A group ID from its 16 bytes; nil for any other count.
    public init?(bytes: some Collection<UInt8>) {
        guard bytes.count == Self.byteCount else { return nil }
        self.bytes = Array(bytes)
    }

    /// The ID of a group upgraded from a shared secret whose legacy key is `legacyKey`.
    public init(legacyKey: DevicePublicKey) {
        bytes = Array(legacyKey.deviceID.bytes.prefix(Self.byteCount))
    }

    /// The same 16 bytes as a UUID (RFC 4122 byte order), e.g. for storing as a record ID.
    public var uuid: UUID { uuidFromBytes(bytes) }

    /// 32 lowercase hexadecimal digits.
    public var description: String { hexString(bytes) }

    public static func < (lhs: GroupID, rhs: GroupID) -> Bool { lhs.bytes.lexicographicallyPrecedes(rhs.bytes) }
}

/// The identity of one roster entry: the first 16 bytes of SHA-256 over its bytes. As a UUID it
/// is the record ID of the entry in the `_roster` collection.
package struct RosterEntryID: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// Bytes in the value.
    public static let byteCount = 16
    /// The raw bytes.
    public let bytes: [UInt8]

    /// An entry ID from its 16 bytes; nil for any other count.
    public init?(bytes: some Collection<UInt8>) {
        guard bytes.count == Self.byteCount else { return nil }
        self.bytes = Array(bytes)
    }

    /// The entry ID of the encoded entry `entryBytes`.
    init(hashing entryBytes: [UInt8]) {
        bytes = Array(SHA256.hash(data: entryBytes).prefix(Self.byteCount))
    }

    /// The record ID of a UUID.
    public init(uuid: UUID) { bytes = uuidBytes(uuid) }

    /// As a UUID: the record ID in `_roster`.
    public var uuid: UUID { uuidFromBytes(bytes) }

    var isZero: Bool { bytes.allSatisfy { $0 == 0 } }

    /// The first 8 hexadecimal digits, for logs.
    public var shortDescription: String { String(description.prefix(8)) }

    /// 32 lowercase hexadecimal digits.
    public var description: String { hexString(bytes) }

    public static func < (lhs: RosterEntryID, rhs: RosterEntryID) -> Bool { lhs.bytes.lexicographicallyPrecedes(rhs.bytes) }
}

/// The secret half of an invite: 16 random bytes, carried in the invite code and revealed once
/// in the joiner's `enrol` entry. Not a key to anything else.
package struct InviteToken: Hashable, Sendable {
    /// Bytes in the value.
    public static let byteCount = 16
    /// The raw bytes.
    public let bytes: [UInt8]

    /// A token from its 16 bytes; nil for any other count.
    public init?(bytes: some Collection<UInt8>) {
        guard bytes.count == Self.byteCount else { return nil }
        self.bytes = Array(bytes)
    }

    /// A new token from the system's secure random source.
    public static func generate() -> InviteToken {
        var generator = SystemRandomNumberGenerator()
        return InviteToken(bytes: (0..<byteCount).map { _ in UInt8.random(in: 0...255, using: &generator) })!
    }

    /// What the `invite` entry publishes: the first 16 bytes of SHA-256(token).
    public var hash: InviteHash { InviteHash(bytes: Array(SHA256.hash(data: bytes)).prefix(InviteHash.byteCount))! }
}

/// Names an invite in the roster without revealing its token.
package struct InviteHash: Hashable, Comparable, Sendable, CustomStringConvertible {
    /// Bytes in the value.
    public static let byteCount = 16
    /// The raw bytes.
    public let bytes: [UInt8]

    /// An invite hash from its 16 bytes; nil for any other count.
    public init?(bytes: some Collection<UInt8>) {
        guard bytes.count == Self.byteCount else { return nil }
        self.bytes = Array(bytes)
    }

    /// The first 8 hexadecimal digits: how people and logs refer to an invite.
    public var description: String { String(hexString(bytes).prefix(8)) }

    public static func < (lhs: InviteHash, rhs: InviteHash) -> Bool { lhs.bytes.lexicographicallyPrecedes(rhs.bytes) }
}

/// What a device may do in its group.
public enum DeviceRole: UInt8, Hashable, Sendable, CustomStringConvertible {
    /// Reads and writes data; may rename itself and claim replica IDs.
    case member = 0
    /// Also adds, removes and renames devices, makes and revokes invites, closes legacy enrolment.
    case admin = 1
    /// A recovery key, not a device: the public half of a recovery code kept offline. It signs
    /// roster entries with an admin's rights (a new device recovering a group whose admin
    /// devices are lost), never holds a session, and does not count as an admin device.
    case recovery = 2
    /// A relay a member runs for the group (docs/RELAY.md): it stores and forwards sealed data
    /// and speaks only the relay protocol. Not a member (it writes nothing and is never given a
    /// data key), not an admin.
    case relay = 3

    public var description: String {
        switch self {
        case .member: "member"
        case .admin: "admin"
        case .recovery: "recovery key"
        case .relay: "relay"
        }
    }

    /// Whether entries signed with this role count as an admin's (admins and recovery keys).
    public var signsAsAdmin: Bool { self == .admin || self == .recovery }

    /// Whether a device of this role is a member device: it syncs, writes and reports (not a
    /// recovery key, not a relay).
    public var isDevice: Bool { self == .member || self == .admin }
}

func hexString(_ bytes: some Sequence<UInt8>) -> String {
    let digits: [Character] = Array("0123456789abcdef")
    var out = ""
    for byte in bytes {
        out.append(digits[Int(byte >> 4)])
        out.append(digits[Int(byte & 15)])
    }
    return out
}

func uuidFromBytes(_ b: [UInt8]) -> UUID {
    precondition(b.count == 16)
    return UUID(uuid: (b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]))
}

func uuidBytes(_ uuid: UUID) -> [UInt8] {
    withUnsafeBytes(of: uuid.uuid) { Array($0) }
}
