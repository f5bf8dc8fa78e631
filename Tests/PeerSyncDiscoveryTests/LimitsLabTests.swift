import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// The limits of issue 17 against real `peersync run` nodes in the namespace lab: a flood of
/// idle connections from one address, and forged DNS-SD adverts with the group's tag (published
/// by real avahi daemons inside the lab).
@Suite(
    "Limits in a network-namespace lab", .ownThread, .serialized,
    .enabled(if: LabEnvironment.isUsable, "needs root, avahi-daemon, dbus-daemon, ip, unshare, setsid")
)
struct LimitsLabTests {
    typealias N = NodeLabTests

    struct Status: Decodable {
        struct Node: Decodable {
            struct Peer: Decodable { var replicaID: String }
            struct Health: Decodable {
                var refusedConnectionsOverAddress: Int
                var refusedConnectionsOverTotal: Int
                var inboundConnections: Int
                var dialTargets: Int
                var dialing: Int
                var dialingPeak: Int
                var rejectedDialTargets: Int
                var dialAttempts: Int
            }
            var peers: [Peer]
            var health: Health?
        }
        var replicaID: String
        var digest: String
        var records: [String: Int]
        var node: Node?
    }

    static func status(_ store: String) -> Status? {
        guard let result = try? N.cli(store, ["status", "--json"]), result.status == 0 else { return nil }
        return try? JSONDecoder().decode(Status.self, from: Data(result.output.utf8))
    }

    static func converged(_ stores: [String]) -> Bool {
        let digests = stores.compactMap { status($0)?.digest }
        return digests.count == stores.count && Set(digests).count == 1
    }

    /// A node in lab host `host` listening on 7946, with extra arguments.
    static func node(_ lab: Lab, host: Int, store: String, _ arguments: [String]) throws -> LabProcess {
        try LabProcess(Lab.scriptPath, ["exec", "h\(host)", N.peersync, "run", "--store", store, "--listen", "0.0.0.0:7946",
                                        "--log-level", "error"] + arguments,
                       environment: lab.environment)
    }

    /// Reads JSON lines from `process` until one satisfies `condition` or `timeout` passes.
    static func line(from process: LabProcess, timeout: Duration, _ condition: ([String: Any]) -> Bool) -> [String: Any]? {
        let deadline = ContinuousClock.now + timeout
        while let text = process.readLine(until: deadline) {
            if let object = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any], condition(object) {
                return object
            }
        }
        return nil
    }

    @Test("1,000 idle connections from one address are refused past the per-address limit; a real peer still syncs (measured: ≤ 2 s)",
          .timeLimit(.minutes(10)))
    func connectionFlood() throws {
        let lab = Lab()
        defer { lab.downAndVerify() }
        try lab.up(3)
        let root = "/tmp/peersync-lab-stores/\(lab.prefix)"
        defer { try? FileManager.default.removeItem(atPath: root) }
        let stores = ["\(root)/victim", "\(root)/honest"]
        #expect(try N.cli(stores[0], ["init", "--name", "victim"]).status == 0)
        let code = try N.cli(stores[0], ["invite"]).output.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(try N.cli(stores[1], ["init", "--name", "honest", "--join", code]).status == 0)
        let victim = try Self.node(lab, host: 1, store: stores[0], ["--no-discovery"])
        defer { _ = victim.terminate(grace: .seconds(10)) }
        #expect(N.poll(timeout: .seconds(20)) { Self.status(stores[0])?.node?.health != nil })

        // h3 opens 1,000 idle connections to the victim, one after the other, and holds them.
        let flood = try LabProcess(Lab.scriptPath, ["exec", "h3", Probe.binaryPath, "--flood", "\(lab.address(ofHost: 1)):7946",
                                                    "--connections", "1000", "--duration", "180"],
                                   environment: lab.environment)
        defer { _ = flood.terminate(grace: .seconds(5)) }
        let opened = Self.line(from: flood, timeout: .seconds(30)) { $0["event"] as? String == "flood" }
        #expect(opened?["opened"] as? Int == 1000, "the flood did not open its connections: \(String(describing: opened))")
        let settled = Self.line(from: flood, timeout: .seconds(30)) {
            $0["event"] as? String == "flood-status" && ($0["closed"] as? Int ?? 0) >= 984
        }
        #expect(settled != nil, "the victim did not close the connections over the per-address limit")
        // The status file is rewritten every 0.5 s.
        #expect(N.poll(timeout: .seconds(30)) { (Self.status(stores[0])?.node?.health?.refusedConnectionsOverAddress ?? 0) >= 984 })
        let flooded = try #require(Self.status(stores[0])?.node?.health)
        print("limits: 1,000 idle connections from one address → victim closed \(flooded.refusedConnectionsOverAddress) on arrival, "
            + "holds \(flooded.inboundConnections); flood reports \(settled?["closed"] ?? "?") closed, \(settled?["open"] ?? "?") open")
        #expect(flooded.refusedConnectionsOverAddress >= 984)
        #expect(flooded.inboundConnections <= 16)
        #expect(settled?["open"] as? Int ?? 1000 <= 16)

        // While the flood holds its 16: the honest node starts, connects, and syncs both ways.
        let started = ContinuousClock.now
        let honest = try Self.node(lab, host: 2, store: stores[1], ["--no-discovery", "--peer", "\(lab.address(ofHost: 1)):7946"])
        defer { _ = honest.terminate(grace: .seconds(10)) }
        #expect(N.poll(timeout: .seconds(20)) { Self.status(stores[0])?.node?.peers.count == 1 })
        let connected = ContinuousClock.now - started
        #expect(try N.cli(stores[1], ["location", "add", "--name", "written during the flood"]).status == 0)
        let edited = ContinuousClock.now
        #expect(N.poll(timeout: .seconds(30)) { Self.converged(stores) })
        let synced = ContinuousClock.now - edited
        #expect(try N.cli(stores[0], ["location", "add", "--name", "and back"]).status == 0)
        let editedBack = ContinuousClock.now
        #expect(N.poll(timeout: .seconds(30)) { Self.converged(stores) && Self.status(stores[1])?.records["locations"] == 2 })
        let syncedBack = ContinuousClock.now - editedBack
        print("limits: during the flood the honest node connected in \(connected) (process start included); "
            + "an edit reached the victim in \(synced), and back in \(syncedBack) (measured by polling `peersync status`)")
        // The issue's "≤ 2 s" is a measured figure (printed above, in docs/RELIABILITY.md), not an
        // assert: under a loaded CI machine a time bound fails without anything being wrong. What
        // is asserted is that the edits crossed while the flood held its connections.
        let still = Self.line(from: flood, timeout: .seconds(30)) { $0["event"] as? String == "flood-status" }
        #expect((still?["closed"] as? Int ?? 0) >= 984)
    }

    @Test("100 forged adverts with the group's tag: dial attempts stay capped, forged addresses back off, the real peer is found and synced",
          .timeLimit(.minutes(10)))
    func forgedAdverts() throws {
        let lab = Lab()
        defer { lab.downAndVerify() }
        try lab.up(4)
        let root = "/tmp/peersync-lab-stores/\(lab.prefix)"
        defer { try? FileManager.default.removeItem(atPath: root) }
        let first = "\(root)/first", second = "\(root)/second", strangerStore = "\(root)/stranger"
        #expect(try N.cli(first, ["init", "--name", "first"]).status == 0)
        let code = try N.cli(first, ["invite"]).output.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(try N.cli(second, ["init", "--name", "second", "--join", code]).status == 0)
        #expect(try N.cli(strangerStore, ["init", "--name", "stranger"]).status == 0)
        // Of two discovered members, the one with the lower replica ID dials: that one is attacked.
        let ids = [first, second].map { N.status($0)?.replicaID ?? "" }
        let (dialer, real) = ids[0] < ids[1] ? (first, second) : (second, first)
        let dialerID = min(ids[0], ids[1])

        // h2: the real peer. h3: another group's node (it refuses members of ours). h4: a black
        // hole (accepts, never answers: a dialer's TLS handshake times out).
        let realNode = try Self.node(lab, host: 2, store: real, [])
        defer { _ = realNode.terminate(grace: .seconds(10)) }
        let stranger = try Self.node(lab, host: 3, store: strangerStore, ["--no-discovery"])
        defer { _ = stranger.terminate(grace: .seconds(10)) }
        let hole = try LabProcess(Lab.scriptPath, ["exec", "h4", Probe.binaryPath, "--hold", "7946"], environment: lab.environment)
        defer { _ = hole.terminate(grace: .seconds(5)) }
        #expect(Self.line(from: hole, timeout: .seconds(20)) { $0["event"] as? String == "holding" } != nil)

        // The group's tag and protocol version, as a browse on h4 sees the real peer's advert.
        let browse = try Probe(lab: lab, host: 4, name: "browser", port: 1, group: "0000000000000000")
        defer { browse.stop() }
        let realID = max(ids[0], ids[1])
        #expect(waitUntil([browse], timeout: .seconds(30)) { browse.events("found").contains { $0.replica == realID } })
        let advert = try #require(browse.events("found").first { $0.replica == realID })
        let tag = try #require(advert.group), version = try #require(advert.version)

        // 100 forged adverts with that tag and random replica IDs above the dialer's: 50 pointing
        // at the stranger's node (h3), 50 at the black hole (h4), published by avahi-publish-service.
        var forgedIDs: [String] = []
        while forgedIDs.count < 100 {
            let id = ReplicaID.random().description
            if id > dialerID { forgedIDs.append(id) }
        }
        var publishers: [LabProcess] = []
        defer { for publisher in publishers { _ = publisher.terminate(grace: .seconds(5)) } }
        for (host, range) in [(3, 0..<50), (4, 50..<100)] {
            let commands = range.map { i in
                "avahi-publish-service -f 'forged \(i)' _peersync._tcp 7946 v=\(version) id=\(forgedIDs[i]) g=\(tag) >/dev/null 2>&1 &"
            }.joined(separator: "\n")
            let script = "trap 'kill $(jobs -p) 2>/dev/null; exit 0' TERM INT\n\(commands)\necho started\nwait\n"
            publishers.append(try LabProcess(Lab.scriptPath, ["exec", "h\(host)", "/bin/bash", "-c", script], environment: lab.environment))
        }
        let visible = waitUntil([browse], timeout: .seconds(60)) {
            Set(browse.events("found").compactMap(\.replica)).intersection(forgedIDs).count == 100
        }
        #expect(visible, "the forged adverts did not all appear")

        // Now the attacked member starts, capped at 2 attempts at once.
        let started = ContinuousClock.now
        let dialerNode = try Self.node(lab, host: 1, store: dialer, ["--max-dials", "2"])
        defer { _ = dialerNode.terminate(grace: .seconds(10)) }
        var samples: [Status.Node.Health] = []
        var connectedAfter: Duration?
        _ = N.poll(timeout: .seconds(60)) {
            guard let node = Self.status(dialer)?.node else { return false }
            if let health = node.health { samples.append(health) }
            if connectedAfter == nil, node.peers.contains(where: { $0.replicaID == realID }) { connectedAfter = ContinuousClock.now - started }
            return connectedAfter != nil
        }
        let connected = try #require(connectedAfter, "the real peer was never connected")
        #expect(try N.cli(real, ["location", "add", "--name", "found among forgeries"]).status == 0)
        let edited = ContinuousClock.now
        #expect(N.poll(timeout: .seconds(20)) { Self.converged([dialer, real]) })
        let synced = ContinuousClock.now - edited
        // Keep watching for 15 s: never more than 2 attempts at once, and the forged addresses back off.
        _ = N.poll(timeout: .seconds(15)) {
            if let health = Self.status(dialer)?.node?.health { samples.append(health) }
            return false
        }
        let last = try #require(samples.last)
        let elapsed = ContinuousClock.now - started
        print("limits: 100 forged adverts (50 → another group's node, 50 → a black hole); the real peer connected \(connected) "
            + "after start, an edit synced in \(synced); after \(elapsed): \(last.dialTargets) addresses, \(last.dialAttempts) attempts, "
            + "peak \(last.dialingPeak) at once, \(last.rejectedDialTargets) backing off")
        #expect(samples.allSatisfy { $0.dialing <= 2 }, "more than 2 attempts at once")
        #expect(last.dialingPeak <= 2)
        // The scheduler dials addresses, not adverts: the 100 forged adverts are 2 targets (h3 and
        // h4 on 7946) besides the real peer, and both back off after their refusals.
        #expect(last.dialTargets == 3)
        #expect(last.rejectedDialTargets == 2)
        // Without the caps every advert started a dial loop redialed every ≤ 5 s (≥ 1,000 attempts
        // in this time); with them, each forged address is tried a few times.
        #expect(last.dialAttempts <= 30, "forged adverts were dialed \(last.dialAttempts) times")
        #expect(connected < .seconds(30))
    }
}
