import Crypto

extension GroupID {
    /// The opaque tag members publish in DNS-SD to recognise each other: the first 8 bytes of
    /// SHA-256(`"peersync discovery tag"` 00 ‖ group ID), as 16 lowercase hex digits. It reveals
    /// neither the group's name nor its members.
    public var discoveryTag: String {
        let digest = SHA256.hash(data: Array("peersync discovery tag".utf8) + [0] + bytes)
        return digest.prefix(8).map { byte in
            let hex = String(byte, radix: 16)
            return hex.count == 1 ? "0" + hex : hex
        }.joined()
    }
}
