import Crypto
@_spi(Engine) import PeerSyncCRDT

/// A P-256 key derived from an old shared group secret (the 20 bytes behind a `PS1-` code):
/// the root of a group upgraded to device identities.
///
/// Every device that knows the secret derives the same key, hence the same group ID (the first
/// 16 bytes of the key's device ID), so devices upgrading independently end in one group. The
/// key signs the group's `legacyGenesis` and the *proof* inside each `legacyEnrol`; because the
/// proof is a signature, every replica can check it with the public key the entry carries (an
/// HMAC could only be checked by replicas that know the secret, and devices that join later by
/// invite do not).
///
/// Derivation: HKDF-SHA256 with the secret as input key material, salt `"peersync v1"`, info
/// `"roster legacy key"` followed by one counter byte (0, then 1, … in the negligible case that
/// 32 bytes are not a valid P-256 scalar), 32 bytes, read as the big-endian private scalar.
package struct LegacyGroupKey: Sendable {
    /// The derived private key (known to every holder of the old secret).
    public let privateKey: P256.Signing.PrivateKey
    /// Its public key, carried by legacyEnrol entries.
    public let publicKey: DevicePublicKey

    /// The key of the group that used `groupSecret` (the old `GroupSecret.bytes`).
    public init(groupSecret: [UInt8]) {
        for counter in UInt8(0)...UInt8(255) {
            let derived = HKDF<SHA256>.deriveKey(
                inputKeyMaterial: SymmetricKey(data: groupSecret), salt: Array("peersync v1".utf8),
                info: Array("roster legacy key".utf8) + [counter], outputByteCount: 32)
            let scalar = derived.withUnsafeBytes { Array($0) }
            if let key = try? P256.Signing.PrivateKey(rawRepresentation: scalar) {
                privateKey = key
                publicKey = DevicePublicKey(key.publicKey)
                return
            }
        }
        fatalError("256 HKDF outputs in a row are not P-256 scalars: impossible unless SHA-256 is broken")
    }

    /// The upgraded group's ID.
    public var groupID: GroupID { GroupID(legacyKey: publicKey) }
}
