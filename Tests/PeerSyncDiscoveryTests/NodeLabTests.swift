import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Real `peersync run` nodes, one per lab host, finding each other by DNS-SD alone.
@Suite(
    "Nodes with discovery in a network-namespace lab", .ownThread, .serialized,
    .enabled(if: LabEnvironment.isUsable, "needs root, avahi-daemon, dbus-daemon, ip, unshare, setsid")
)
struct NodeLabTests {
    static let peersync = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        .appendingPathComponent("peersync").path

    /// The `peersync` command run outside the lab (it only reads and writes the store files).
    static func cli(_ store: String, _ arguments: [String]) throws -> CommandResult {
        try runCommand(peersync, arguments + ["--store", store], timeout: .seconds(60))
    }

    struct Status: Decodable {
        struct Node: Decodable {
            struct Peer: Decodable { var replicaID: String }
            var peers: [Peer]
        }
        var replicaID: String
        var digest: String
        var records: [String: Int]
        var node: Node?
    }

    static func status(_ store: String) -> Status? {
        guard let result = try? cli(store, ["status", "--json"]), result.status == 0 else { return nil }
        return try? JSONDecoder().decode(Status.self, from: Data(result.output.utf8))
    }

    static func poll(timeout: Duration, _ condition: () -> Bool) -> Bool {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if condition() { return true }
            usleep(50_000)
        }
        return condition()
    }

    @Test("three nodes with discovery only (no --peer) find each other and converge; another group's node is never connected",
          .timeLimit(.minutes(10)))
    func discoveryOnly() throws {
        let lab = Lab()
        defer { lab.downAndVerify() }
        try lab.up(4)
        let root = "/tmp/peersync-lab-stores/\(lab.prefix)"
        defer { try? FileManager.default.removeItem(atPath: root) }
        let stores = (1...4).map { "\(root)/h\($0)" }
        #expect(try Self.cli(stores[0], ["init", "--name", "h1"]).status == 0)
        for (i, name) in [(1, "h2"), (2, "h3")] {
            let code = try Self.cli(stores[0], ["invite"]).output.trimmingCharacters(in: .whitespacesAndNewlines)
            #expect(try Self.cli(stores[i], ["init", "--name", name, "--join", code]).status == 0)
        }
        #expect(try Self.cli(stores[3], ["init", "--name", "stranger"]).status == 0)  // a group of its own
        _ = try Self.cli(stores[3], ["location", "add", "--name", "stranger's secret place"])

        let started = ContinuousClock.now
        let nodes = try (1...4).map { host in
            try LabProcess(Lab.scriptPath, ["exec", "h\(host)", Self.peersync, "run", "--store", stores[host - 1],
                                            "--listen", "0.0.0.0:7946", "--log-level", "warning"],
                           environment: lab.environment)
        }
        defer { for node in nodes { _ = node.terminate(grace: .seconds(10)) } }

        let connected = Self.poll(timeout: .seconds(60)) {
            stores.prefix(3).allSatisfy { (Self.status($0)?.node?.peers.count ?? 0) == 2 }
        }
        let elapsed = ContinuousClock.now - started
        #expect(connected, "nodes did not all connect: \(stores.map { Self.status($0)?.node?.peers.count ?? -1 })")
        print("discovery: 3 nodes started → every pair connected in \(elapsed) (includes process start and avahi's ~0.8 s probe)")

        for (i, store) in stores.prefix(3).enumerated() {
            #expect(try Self.cli(store, ["location", "add", "--name", "place on h\(i + 1)"]).status == 0)
        }
        let converged = Self.poll(timeout: .seconds(30)) {
            let digests = stores.prefix(3).compactMap { Self.status($0)?.digest }
            return digests.count == 3 && Set(digests).count == 1
        }
        #expect(converged)
        #expect(Self.status(stores[0])?.records["locations"] == 3)

        // The stranger advertises (a browse sees it) but nobody connects to it, either way.
        let stranger = try #require(Self.status(stores[3]))
        #expect(stranger.node?.peers.isEmpty == true)
        #expect(stranger.records["locations"] == 1)
        for store in stores.prefix(3) {
            #expect(Self.status(store)?.node?.peers.contains { $0.replicaID == stranger.replicaID } == false)
        }
        let browse = try Probe(lab: lab, host: 1, name: "browser", port: 1, group: "0000000000000000",
                               wrapper: [])
        defer { browse.stop() }
        let seen = Self.poll(timeout: .seconds(20)) {
            browse.pump()
            return browse.events("found").contains { $0.replica == stranger.replicaID }
        }
        #expect(seen, "the stranger's node was not visible to a browse")
        if let event = browse.events("found").first(where: { $0.replica == stranger.replicaID }) {
            #expect(event.group?.count == 16 && event.group?.allSatisfy(\.isHexDigit) == true)
            #expect(event.name?.contains("secret") == false)
        }
        for node in nodes { #expect(node.terminate(grace: .seconds(10)) == 0, "a node did not stop cleanly on SIGTERM") }
    }
}
