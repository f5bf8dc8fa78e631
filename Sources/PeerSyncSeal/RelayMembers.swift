import Crypto
import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity

/// Who may use a relay for one group: the group's active devices and relays by public key and
/// role, with no names, signed by an admin (docs/PROTOCOL.md §20.3):
///
/// ```
/// statement = body signature
/// body      = u8(format = 1) bytes16(group ID) varint(sequence) varint(#members)
///             (bytes65(public key, X9.63) u8(role))…  bytes20(signer device ID)
/// signature = bytes64: ECDSA P-256 low-S by the signer over "peersync relay members v1" 00 ‖ body
/// ```
/// Members appear in ascending order of their public keys, each once. A relay takes the first
/// statement of a group together with the relay's enrolment secret (``RelayCode``); a later one
/// only with a higher sequence, signed by an admin of the statement it holds. The roster itself
/// (which holds names) never reaches a relay.
package struct RelayMembers: Sendable, Equatable {
    public let groupID: GroupID
    public let sequence: UInt64
    public let members: [DevicePublicKey: DeviceRole]
    public let signer: DeviceID
    public let signature: [UInt8]

    static let format: UInt8 = 1
    static let signingDomain = Array("peersync relay members v1".utf8) + [0]
    /// Most members one statement lists.
    public static let maxMembers = 4096

    /// Signs a statement listing `members` as `sequence` of `group`'s statements.
    public static func sign(group: GroupID, sequence: UInt64, members: [DevicePublicKey: DeviceRole], by signer: DeviceKey) -> RelayMembers {
        let unsigned = RelayMembers(groupID: group, sequence: sequence, members: members, signer: signer.deviceID, signature: [])
        return RelayMembers(groupID: group, sequence: sequence, members: members, signer: signer.deviceID,
                            signature: signer.signature(for: signingDomain + unsigned.body))
    }

    init(groupID: GroupID, sequence: UInt64, members: [DevicePublicKey: DeviceRole], signer: DeviceID, signature: [UInt8]) {
        self.groupID = groupID
        self.sequence = sequence
        self.members = members
        self.signer = signer
        self.signature = signature
    }

    var body: [UInt8] {
        var writer = SealWriter()
        writer.byte(Self.format)
        writer.raw(groupID.bytes)
        writer.varint(sequence)
        writer.varint(UInt64(members.count))
        for (key, role) in members.sorted(by: { $0.key.x963.lexicographicallyPrecedes($1.key.x963) }) {
            writer.raw(key.x963)
            writer.byte(role.rawValue)
        }
        writer.raw(signer.bytes)
        return writer.bytes
    }

    /// The statement's bytes.
    public var bytes: [UInt8] { body + signature }

    /// Parses a statement and checks its form (not its signature: ``isSigned(by:)``).
    public init(bytes: [UInt8]) throws(SealError) {
        var reader = SealReader(bytes, what: "relay members")
        guard try reader.byte("format") == Self.format else { throw .malformed("relay members: unknown format") }
        groupID = GroupID(bytes: try reader.raw(16, "group ID"))!
        sequence = try reader.varint("sequence")
        let count = try reader.varint("member count")
        guard count <= UInt64(Self.maxMembers) else { throw .malformed("relay members: \(count) members (at most \(Self.maxMembers))") }
        var members: [DevicePublicKey: DeviceRole] = [:]
        var previous: [UInt8]?
        for _ in 0..<count {
            let raw = try reader.raw(65, "member key")
            if let previous, !previous.lexicographicallyPrecedes(raw) { throw .malformed("relay members: keys not ascending") }
            previous = raw
            guard let key = DevicePublicKey(x963: raw) else { throw .malformed("relay members: a member key is not a P-256 point") }
            guard let role = DeviceRole(rawValue: try reader.byte("role")) else { throw .malformed("relay members: unknown role") }
            members[key] = role
        }
        self.members = members
        signer = DeviceID(bytes: try reader.raw(20, "signer"))!
        signature = try reader.raw(64, "signature")
        guard reader.isAtEnd else { throw .malformed("relay members: trailing bytes") }
    }

    /// The member whose device ID is `device`, with its role.
    public func member(_ device: DeviceID) -> (key: DevicePublicKey, role: DeviceRole)? {
        members.first { $0.key.deviceID == device }.map { ($0.key, $0.value) }
    }

    /// Whether `key` (the signer's) signed this statement.
    public func isSigned(by key: DevicePublicKey) -> Bool {
        key.deviceID == signer && key.isValidSignature(signature, for: Self.signingDomain + body)
    }

    /// Whether the statement is signed by one of its own admins (a group's first statement).
    public var isSelfSigned: Bool {
        guard let (key, role) = member(signer), role == .admin else { return false }
        return isSigned(by: key)
    }

    /// Whether the same devices with the same roles as `members`.
    public func lists(_ members: [DevicePublicKey: DeviceRole]) -> Bool { self.members == members }
}
