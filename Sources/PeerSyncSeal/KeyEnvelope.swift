import Crypto
import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity

/// A group's data key of one epoch, sealed to one device's key with HPKE (RFC 9180, base mode,
/// DHKEM(P-256, HKDF-SHA256), HKDF-SHA256, AES-256-GCM) and signed by the device that made it
/// (an admin: the roster says who may; see docs/PROTOCOL.md §20.2):
///
/// ```
/// envelope = body signature
/// body     = u8(format = 1) bytes16(group ID) varint(epoch) bytes20(recipient device ID)
///            bytes20(sender device ID) bytes65(HPKE encapsulated key) bytes48(ciphertext)
/// HPKE info = "peersync data key v1" 00 ‖ group ID ‖ varint(epoch); aad empty; plaintext = the key
/// signature = bytes64: ECDSA P-256 low-S by the sender's device key over
///             "peersync key envelope v1" 00 ‖ body
/// ```
/// The recipient's device key opens it (its P-256 scalar used for key agreement); nobody else
/// can, the relay that stores it included.
package struct KeyEnvelope: Sendable, Equatable {
    public let groupID: GroupID
    public let epoch: UInt64
    public let recipient: DeviceID
    public let sender: DeviceID
    let encapsulatedKey: [UInt8]
    let ciphertext: [UInt8]
    public let signature: [UInt8]

    static let format: UInt8 = 1
    static let signingDomain = Array("peersync key envelope v1".utf8) + [0]
    static let ciphersuite = HPKE.Ciphersuite.P256_SHA256_AES_GCM_256

    static func info(group: GroupID, epoch: UInt64) -> Data {
        var writer = SealWriter()
        writer.raw(Array("peersync data key v1".utf8) + [0])
        writer.raw(group.bytes)
        writer.varint(epoch)
        return Data(writer.bytes)
    }

    /// Seals `key` of `group` to `recipient`, signed by `sender`.
    public static func seal(_ key: DataKey, group: GroupID, to recipient: DevicePublicKey, by sender: DeviceKey) throws -> KeyEnvelope {
        let agreement = try P256.KeyAgreement.PublicKey(x963Representation: recipient.x963)
        var hpke = try HPKE.Sender(recipientKey: agreement, ciphersuite: ciphersuite, info: info(group: group, epoch: key.epoch))
        let ciphertext = try hpke.seal(key.bytes)
        let unsigned = KeyEnvelope(groupID: group, epoch: key.epoch, recipient: recipient.deviceID, sender: sender.deviceID,
                                   encapsulatedKey: Array(hpke.encapsulatedKey), ciphertext: Array(ciphertext), signature: [])
        return KeyEnvelope(groupID: group, epoch: key.epoch, recipient: recipient.deviceID, sender: sender.deviceID,
                           encapsulatedKey: unsigned.encapsulatedKey, ciphertext: unsigned.ciphertext,
                           signature: sender.signature(for: signingDomain + unsigned.body))
    }

    var body: [UInt8] {
        var writer = SealWriter()
        writer.byte(Self.format)
        writer.raw(groupID.bytes)
        writer.varint(epoch)
        writer.raw(recipient.bytes)
        writer.raw(sender.bytes)
        writer.raw(encapsulatedKey)
        writer.raw(ciphertext)
        return writer.bytes
    }

    /// The envelope's bytes.
    public var bytes: [UInt8] { body + signature }

    /// Its record ID in the collection `_keys`: the first 16 bytes of SHA-256 of its bytes.
    public var recordID: UUID {
        let d = Array(SHA256.hash(data: bytes).prefix(16))
        return UUID(uuid: (d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12], d[13], d[14], d[15]))
    }

    /// Parses an envelope (nothing verified but its form).
    public init(bytes: [UInt8]) throws(SealError) {
        var reader = SealReader(bytes, what: "key envelope")
        guard try reader.byte("format") == Self.format else { throw .malformed("key envelope: unknown format") }
        groupID = GroupID(bytes: try reader.raw(16, "group ID"))!
        epoch = try reader.varint("epoch")
        recipient = DeviceID(bytes: try reader.raw(20, "recipient"))!
        sender = DeviceID(bytes: try reader.raw(20, "sender"))!
        encapsulatedKey = try reader.raw(65, "encapsulated key")
        ciphertext = try reader.raw(48, "ciphertext")
        signature = try reader.raw(64, "signature")
        guard reader.isAtEnd else { throw .malformed("key envelope: trailing bytes") }
    }

    init(groupID: GroupID, epoch: UInt64, recipient: DeviceID, sender: DeviceID, encapsulatedKey: [UInt8], ciphertext: [UInt8],
         signature: [UInt8]) {
        self.groupID = groupID
        self.epoch = epoch
        self.recipient = recipient
        self.sender = sender
        self.encapsulatedKey = encapsulatedKey
        self.ciphertext = ciphertext
        self.signature = signature
    }

    /// Whether `senderKey` (the key of ``sender``) signed this envelope.
    public func isSigned(by senderKey: DevicePublicKey) -> Bool {
        senderKey.deviceID == sender && senderKey.isValidSignature(signature, for: Self.signingDomain + body)
    }

    /// The data key, opened with `device`'s key (the recipient's). Check the signature first
    /// (``isSigned(by:)``) against a sender the roster allows.
    public func open(with device: DeviceKey, group: GroupID) throws(SealError) -> DataKey {
        guard device.deviceID == recipient else { throw .notForThis("a key envelope for device \(recipient.shortForm), not this one") }
        guard group == groupID else { throw .notForThis("a key envelope of another group") }
        do {
            let agreement = try P256.KeyAgreement.PrivateKey(rawRepresentation: device.privateKey.rawRepresentation)
            var hpke = try HPKE.Recipient(privateKey: agreement, ciphersuite: Self.ciphersuite, info: Self.info(group: groupID, epoch: epoch),
                                          encapsulatedKey: Data(encapsulatedKey))
            let key = try hpke.open(ciphertext)
            guard let data = DataKey(epoch: epoch, bytes: Array(key)) else { throw SealError.cannotOpen("the key envelope holds no 32-byte key") }
            return data
        } catch let error as SealError {
            throw error
        } catch {
            throw .cannotOpen("the key envelope does not open with this device's key (\(error))")
        }
    }
}
