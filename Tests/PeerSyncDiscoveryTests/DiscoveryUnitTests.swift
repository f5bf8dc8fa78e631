import PeerSyncCRDT
import Testing

@testable import PeerSyncDiscovery

/// Parts of discovery that need no daemon: TXT encoding and error descriptions.
@Suite("Discovery without a network")
struct DiscoveryUnitTests {
    @Test("The advertisement's TXT record holds v, id and g, and decodes back")
    func txtRoundTrip() throws {
        let replica = try #require(ReplicaID(hex: "0123456789abcdef0011223344556677"))
        let advertisement = PeerAdvertisement(
            serviceName: "laptop", port: 7000, replicaID: replica, groupTag: "9f86d081884c7d65", protocolVersion: 3)
        let bytes = try #require(TXTRecord.encode(advertisement.txtEntries))
        #expect(bytes.first == 3)  // "v=3"
        let decoded = bytes.withUnsafeBytes { TXTRecord.decode($0) }
        #expect(decoded == ["v": "3", "id": "0123456789abcdef0011223344556677", "g": "9f86d081884c7d65"])
    }

    @Test("TXT decoding is lenient: case-insensitive keys, first one wins, bare keys, truncated tails")
    func txtDecodingEdgeCases() {
        let bytes: [UInt8] = [3] + Array("V=2".utf8) + [3] + Array("v=9".utf8) + [4] + Array("flag".utf8) + [0]
            + [9] + Array("g=".utf8)  // claims 9 bytes, has 2
        let decoded = bytes.withUnsafeBytes { TXTRecord.decode($0) }
        #expect(decoded == ["v": "2", "flag": ""])
    }

    @Test("TXT encoding refuses entries over 255 bytes and bad keys")
    func txtEncodingLimits() {
        #expect(TXTRecord.encode([("g", String(repeating: "x", count: 253))])?.count == 256)
        #expect(TXTRecord.encode([("g", String(repeating: "x", count: 254))]) == nil)
        #expect(TXTRecord.encode([("", "x")]) == nil)
        #expect(TXTRecord.encode([("a=b", "x")]) == nil)
    }

    @Test("Errors name the constant and say what to do")
    func errorDescriptions() {
        #expect(DNSSDError.unknown.description
            == "kDNSServiceErr_Unknown (-65537): no avahi daemon reachable (is avahi-daemon running and D-Bus reachable?)")
        #expect(DNSSDError.unknown.isDaemonUnreachable)
        #expect(DNSSDError(code: -65548).name == "kDNSServiceErr_NameConflict")
        #expect(!DNSSDError(code: -65548).isDaemonUnreachable)
        #expect(DNSSDError(code: -1).description == "DNSServiceErrorType (-1): DNS-SD call failed")
    }

}
