import Crypto
@_spi(Engine) import PeerSyncCRDT
import SwiftASN1
import X509

/// A device's TLS certificate: self-signed X.509 v3 for the device key, made at run time
/// (never stored; a new one at every start is fine because peers check only the key).
///
/// Subject and issuer: `CN=<device ID, human form>`, `O=PeerSync`, and `OU=<device name>` if
/// given (informative only: in TLS 1.3 certificates travel encrypted, and peers identify a
/// device by the fingerprint of its key, ``DeviceID``, never by a name). Random 20-byte serial
/// number, ECDSA-with-SHA256, basic constraints CA:false, key usage digitalSignature, extended
/// key usage serverAuth + clientAuth (one certificate for dialing and for accepting).
package struct DeviceCertificate: Sendable {
    /// DER bytes, as NIOSSL loads them (`NIOSSLCertificate(bytes:format: .der)`).
    public let derBytes: [UInt8]
    /// The device ID of the certified key.
    public let deviceID: DeviceID

    /// Makes a certificate for `key`, valid over `validity` (default: a day before `now` — for
    /// peers whose clocks lag — until ten years after).
    public static func make(
        key: DeviceKey, deviceName: String? = nil, validity: ClosedRange<Date>? = nil, now: Date = Date()
    ) throws -> DeviceCertificate {
        let validity = validity ?? now.addingTimeInterval(-86_400)...now.addingTimeInterval(10 * 365.25 * 86_400)
        let deviceID = key.deviceID
        let name = try DistinguishedName {
            CommonName(deviceID.humanForm)
            OrganizationName("PeerSync")
            if let deviceName, !deviceName.isEmpty { OrganizationalUnitName(deviceName) }
        }
        let extensions = try Certificate.Extensions {
            Critical(BasicConstraints.notCertificateAuthority)
            Critical(KeyUsage(digitalSignature: true))
            try ExtendedKeyUsage([.serverAuth, .clientAuth])
        }
        let certificate = try Certificate(
            version: .v3, serialNumber: Certificate.SerialNumber(), publicKey: .init(key.privateKey.publicKey),
            notValidBefore: validity.lowerBound, notValidAfter: validity.upperBound, issuer: name, subject: name,
            signatureAlgorithm: .ecdsaWithSHA256, extensions: extensions, issuerPrivateKey: .init(key.privateKey))
        var serializer = DER.Serializer()
        try serializer.serialize(certificate)
        return DeviceCertificate(derBytes: serializer.serializedBytes, deviceID: deviceID)
    }
}
