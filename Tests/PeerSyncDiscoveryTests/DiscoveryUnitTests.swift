import Foundation
@_spi(Engine) import PeerSyncCRDT
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

/// The handshake between callers and a run's thread, with a plain thread standing in for the
/// discovery thread (no DNS-SD).
@Suite("Discovery run stop and exit")
struct DiscoveryRunTests {
    @Test("Awaiting the exit returns true once the thread has exited, at once if it already has")
    func waitForExitReturnsOnExit() async {
        let run = DiscoveryRun()
        run.requestStop()
        #expect(run.stopRequested)
        let thread = Thread { run.markExited() }
        thread.start()
        #expect(await run.waitForExit(timeout: .seconds(30)))
        #expect(run.hasExited)
        #expect(await run.waitForExit(timeout: .zero))
    }

    @Test("Awaiting the exit of a thread that does not exit times out with false")
    func waitForExitTimesOut() async {
        let run = DiscoveryRun()
        defer { run.markExited() }
        #expect(await run.waitForExit(timeout: .milliseconds(50)) == false)
        #expect(!run.hasExited)
    }

    @Test("A cancelled wait returns false; other waiters still see the exit")
    func waitForExitCancelled() async {
        let run = DiscoveryRun()
        let cancelled = Task { await run.waitForExit(timeout: .seconds(30)) }
        let patient = Task { await run.waitForExit(timeout: .seconds(30)) }
        cancelled.cancel()
        #expect(await cancelled.value == false)
        run.markExited()
        #expect(await patient.value)
    }

    @Test("A run asked to stop counts as stopping until its thread exits; new runs wait for it")
    func stoppingRunsAreKnownUntilExit() async {
        let old = DiscoveryRun()
        let new = DiscoveryRun()
        #expect(!DiscoveryRun.stopping(except: new).contains { $0 === old })  // still running
        old.requestStop()
        #expect(DiscoveryRun.stopping(except: new).contains { $0 === old })
        #expect(!DiscoveryRun.stopping(except: old).contains { $0 === old })
        // The new run's thread blocks (a thread of its own, as in PeerDiscovery.start) until the old one exits.
        let sawExit = await withCheckedContinuation { continuation in
            Thread {
                DiscoveryRun.blockUntilExited([old], timeout: .seconds(30))
                continuation.resume(returning: old.hasExited)
            }.start()
            Thread { old.markExited() }.start()
        }
        #expect(sawExit)
        #expect(!DiscoveryRun.stopping(except: new).contains { $0 === old })
        new.markExited()
    }
}
