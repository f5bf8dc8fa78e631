import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Faults real LANs produce, in the namespace lab: partitions that heal, packet loss, and a
/// wiretap on the bridge.
@Suite(
    "Faults in a network-namespace lab", .ownThread, .serialized,
    .enabled(if: LabEnvironment.isUsable, "needs root, avahi-daemon, dbus-daemon, ip, unshare, setsid")
)
struct LabFaultTests {
    typealias N = NodeLabTests

    /// Three nodes in one group on lab hosts 1–3, meshed with static peers (no discovery, so
    /// the timings measure the sessions alone). Returns stores and node processes.
    static func meshedNodes(_ lab: Lab, root: String, insecure: Bool = false, port: Int = 7946, hosts: [Int] = [1, 2, 3])
        throws -> (stores: [String], nodes: [LabProcess])
    {
        let stores = hosts.map { "\(root)/h\($0)-\(port)" }
        #expect(try N.cli(stores[0], ["init", "--name", "h\(hosts[0])"]).status == 0)
        for (i, host) in hosts.enumerated().dropFirst() {
            let code = try N.cli(stores[0], ["invite"]).output.trimmingCharacters(in: .whitespacesAndNewlines)
            #expect(try N.cli(stores[i], ["init", "--name", "h\(host)", "--join", code]).status == 0)
        }
        let nodes = try hosts.enumerated().map { i, host in
            let peers = hosts[..<i].flatMap { ["--peer", "\(lab.address(ofHost: $0)):\(port)"] }
            return try LabProcess(Lab.scriptPath, ["exec", "h\(host)", N.peersync, "run", "--store", stores[i],
                                                   "--listen", "0.0.0.0:\(port)", "--no-discovery", "--log-level", "error"]
                                    + peers + (insecure ? ["--insecure"] : []),
                                  environment: lab.environment)
        }
        let connected = N.poll(timeout: .seconds(30)) {
            stores.allSatisfy { (N.status($0)?.node?.peers.count ?? 0) == hosts.count - 1 }
        }
        #expect(connected, "nodes did not connect")
        return (stores, nodes)
    }

    static func converged(_ stores: [String]) -> Bool {
        let digests = stores.compactMap { N.status($0)?.digest }
        return digests.count == stores.count && Set(digests).count == 1
    }

    @Test("a host cut off while everyone edits converges after the heal; 30% packet loss still converges",
          .timeLimit(.minutes(10)))
    func partitionAndLoss() throws {
        let lab = Lab()
        defer { lab.downAndVerify() }
        try lab.up(3)
        let root = "/tmp/peersync-lab-stores/\(lab.prefix)"
        defer { try? FileManager.default.removeItem(atPath: root) }
        let (stores, nodes) = try Self.meshedNodes(lab, root: root)
        defer { for node in nodes { _ = node.terminate(grace: .seconds(10)) } }

        // Partition h3 for 8 s while all three edit.
        #expect(try lab.run(["cut", "h3"]).status == 0)
        for round in 0..<4 {
            for (i, store) in stores.enumerated() {
                #expect(try N.cli(store, ["location", "add", "--name", "cut \(round) on h\(i + 1)"]).status == 0)
            }
        }
        #expect(N.poll(timeout: .seconds(20)) { Self.converged(Array(stores.prefix(2))) })
        #expect(!Self.converged(stores))
        _ = N.poll(timeout: .seconds(8)) { false }  // let the partition outlast the dead-peer timeout
        let healed = ContinuousClock.now
        #expect(try lab.run(["heal", "h3"]).status == 0)
        let afterHeal = N.poll(timeout: .seconds(30)) { Self.converged(stores) }
        let healTime = ContinuousClock.now - healed
        #expect(afterHeal)
        print("reliability: partition of 8 s healed → equal digests in \(healTime)")
        #expect(N.status(stores[2])?.records["locations"] == 12)

        // 30% frame loss to and from h2 while h1 and h2 edit.
        #expect(try lab.run(["loss", "h2", "30"]).status == 0)
        let lossy = ContinuousClock.now
        for round in 0..<3 {
            #expect(try N.cli(stores[0], ["location", "add", "--name", "loss \(round) on h1"]).status == 0)
            #expect(try N.cli(stores[1], ["location", "add", "--name", "loss \(round) on h2"]).status == 0)
        }
        let underLoss = N.poll(timeout: .seconds(60)) { Self.converged(stores) }
        #expect(underLoss)
        print("reliability: 30% loss on h2's link → equal digests \(ContinuousClock.now - lossy) after the edits")
        #expect(try lab.run(["heal", "h2"]).status == 0)
    }

    @Test("a capture on the lab bridge holds no plaintext of a secure session (and does of an insecure one)",
          .timeLimit(.minutes(10)))
    func captureHasNoPlaintext() throws {
        let lab = Lab()
        defer { lab.downAndVerify() }
        try lab.up(2)
        let root = "/tmp/peersync-lab-stores/\(lab.prefix)"
        defer { try? FileManager.default.removeItem(atPath: root) }
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        let capture = "\(root)/bridge.pcap"
        let tcpdump = try LabProcess("/usr/bin/env", ["ip", "netns", "exec", "\(lab.prefix)-br", "tcpdump", "-i", "br0", "-U",
                                                      "-s", "0", "-w", capture, "tcp"], environment: lab.environment)
        _ = N.poll(timeout: .seconds(10)) { FileManager.default.fileExists(atPath: capture) }
        let secure = try Self.meshedNodes(lab, root: root, port: 7946, hosts: [1, 2])
        let plain = try Self.meshedNodes(lab, root: root, insecure: true, port: 7950, hosts: [1, 2])
        let secretMarker = "SECRET-MARKER-\(UUID().uuidString)"
        let plainMarker = "PLAIN-MARKER-\(UUID().uuidString)"
        #expect(try N.cli(secure.stores[0], ["location", "add", "--name", secretMarker]).status == 0)
        #expect(try N.cli(plain.stores[0], ["location", "add", "--name", plainMarker]).status == 0)
        #expect(N.poll(timeout: .seconds(20)) { Self.converged(secure.stores) && Self.converged(plain.stores) })
        for node in secure.nodes + plain.nodes { _ = node.terminate(grace: .seconds(10)) }
        kill(tcpdump.pid, SIGINT)
        _ = tcpdump.waitForExit(timeout: .seconds(10)) ?? tcpdump.terminate(grace: .seconds(2))
        let bytes = try Data(contentsOf: URL(fileURLWithPath: capture))
        print("reliability: captured \(bytes.count) bytes on the lab bridge")
        #expect(bytes.count > 1_000)
        #expect(bytes.range(of: Data(plainMarker.utf8)) != nil, "the insecure session's record should be visible (the capture works)")
        #expect(bytes.range(of: Data(secretMarker.utf8)) == nil, "the secure session leaked a record in plaintext")
    }
}
