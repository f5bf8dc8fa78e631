import Crypto
import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity

/// A device with an invite asking its inviter to admit it, through a relay (docs/PROTOCOL.md
/// §20.6): its signed enrol entry (which names it and carries the invite's token), sealed with
/// HPKE to the inviter's device key, so the relay that carries it reads neither.
///
/// ```
/// request    = u8(format = 1) bytes16(group ID) bytes20(joiner device ID) bytes20(inviter device ID)
///              bytes65(HPKE encapsulated key) varint(len) ciphertext
/// ciphertext = HPKE base mode, DHKEM(P-256, HKDF-SHA256), HKDF-SHA256, AES-256-GCM, to the
///              inviter's device key; info = "peersync relay join v1" 00 ‖ group ID ‖ joiner ID;
///              aad empty; plaintext = the enrol entry's bytes (§11)
/// ```
/// Not signed as a whole: the entry inside is signed by the joiner, and the inviter checks it
/// names the device the relay says sent it.
package struct JoinRequest: Sendable, Equatable {
    public let groupID: GroupID
    public let joiner: DeviceID
    public let inviter: DeviceID
    let encapsulatedKey: [UInt8]
    let ciphertext: [UInt8]

    static let format: UInt8 = 1
    static let ciphersuite = HPKE.Ciphersuite.P256_SHA256_AES_GCM_256
    /// Largest entry a request carries.
    public static let maxEntryBytes = 4096

    static func info(group: GroupID, joiner: DeviceID) -> Data {
        Data(Array("peersync relay join v1".utf8) + [0] + group.bytes + joiner.bytes)
    }

    /// Seals `entry` (the joiner's enrol) for `inviter`.
    public static func seal(_ entry: [UInt8], group: GroupID, joiner: DeviceID, to inviter: DevicePublicKey) throws -> JoinRequest {
        let agreement = try P256.KeyAgreement.PublicKey(x963Representation: inviter.x963)
        var hpke = try HPKE.Sender(recipientKey: agreement, ciphersuite: ciphersuite, info: info(group: group, joiner: joiner))
        return JoinRequest(groupID: group, joiner: joiner, inviter: inviter.deviceID, encapsulatedKey: Array(hpke.encapsulatedKey),
                           ciphertext: Array(try hpke.seal(entry)))
    }

    init(groupID: GroupID, joiner: DeviceID, inviter: DeviceID, encapsulatedKey: [UInt8], ciphertext: [UInt8]) {
        self.groupID = groupID
        self.joiner = joiner
        self.inviter = inviter
        self.encapsulatedKey = encapsulatedKey
        self.ciphertext = ciphertext
    }

    public var bytes: [UInt8] {
        var writer = SealWriter()
        writer.byte(Self.format)
        writer.raw(groupID.bytes)
        writer.raw(joiner.bytes)
        writer.raw(inviter.bytes)
        writer.raw(encapsulatedKey)
        writer.lengthPrefixed(ciphertext)
        return writer.bytes
    }

    public init(bytes: [UInt8]) throws(SealError) {
        var reader = SealReader(bytes, what: "join request")
        guard try reader.byte("format") == Self.format else { throw .malformed("join request: unknown format") }
        groupID = GroupID(bytes: try reader.raw(16, "group ID"))!
        joiner = DeviceID(bytes: try reader.raw(20, "joiner"))!
        inviter = DeviceID(bytes: try reader.raw(20, "inviter"))!
        encapsulatedKey = try reader.raw(65, "encapsulated key")
        ciphertext = try reader.lengthPrefixed("ciphertext", max: Self.maxEntryBytes + 16)
        guard reader.isAtEnd else { throw .malformed("join request: trailing bytes") }
    }

    /// The enrol entry's bytes, opened with the inviter's key.
    public func open(with inviter: DeviceKey) throws(SealError) -> [UInt8] {
        guard inviter.deviceID == self.inviter else { throw .notForThis("a join request for device \(self.inviter.shortForm), not this one") }
        do {
            let agreement = try P256.KeyAgreement.PrivateKey(rawRepresentation: inviter.privateKey.rawRepresentation)
            var hpke = try HPKE.Recipient(privateKey: agreement, ciphersuite: Self.ciphersuite, info: Self.info(group: groupID, joiner: joiner),
                                          encapsulatedKey: Data(encapsulatedKey))
            return Array(try hpke.open(ciphertext))
        } catch {
            throw .cannotOpen("the join request does not open with this device's key (\(error))")
        }
    }
}
