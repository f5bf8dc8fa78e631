import Foundation
import NIOCore
import NIOPosix
import PeerSync
import PeerSyncIdentity
@testable import PeerSyncNetwork
import PeerSyncTestSupport
import PeerSyncWire
import Testing

/// `peersync relay` processes on 127.0.0.1, with `peersync run --relay` nodes (issue 33).
enum Relays {
    /// Starts a relay on `port` (0: any) and returns it with its port and relay code.
    static func start(_ directory: String, port: Int = 0, extra: [String] = []) throws -> (process: ChildProcess, port: Int, code: String) {
        let process = try ChildProcess(Nodes.binary, ["relay", "serve", "--store", directory, "--listen", "127.0.0.1:\(port)",
                                                      "--log-level", "error"] + extra)
        let deadline = ContinuousClock.now + .seconds(20)
        var bound: Int?
        var code: String?
        while code == nil, let line = process.readLine(until: deadline) {
            if line.hasPrefix("relay "), let last = line.split(separator: ":").last { bound = Int(last) }
            if let range = line.range(of: "PSL-") { code = String(line[range.lowerBound...]) }
        }
        return (process, try #require(bound, "the relay did not start"), try #require(code))
    }

    /// A node of `store` dialing `relays` (and `peers`), listening on 127.0.0.1.
    static func node(_ store: String, relays: [String], peers: [String] = []) throws -> ChildProcess {
        try ChildProcess(Nodes.binary, ["run", "--store", store, "--listen", "127.0.0.1:0", "--log-level", "error", "--no-discovery"]
                            + relays.flatMap { ["--relay", $0] } + peers.flatMap { ["--peer", $0] })
    }

    /// A group of `count` stores whose joins are complete (they met once, directly).
    static func team(_ count: Int, label: String) async throws -> [String] {
        let stores = try Nodes.group(count, label: label)
        let first = try Nodes.start(stores[0])
        let address = try await Nodes.address(stores[0], pid: first.pid)
        let others = try stores.dropFirst().map { try Nodes.start($0, peers: [address]) }
        #expect(await eventually { Nodes.converged(stores) })
        for node in [first] + others { node.kill(SIGTERM) }
        return stores
    }

    struct NodeRelays: Decodable {
        struct Node: Decodable {
            struct Relay: Decodable { var connected: Bool; var pending: UInt64; var lastUpload: Date? }
            var relays: [Relay]?
        }
        var node: Node?
    }

    /// The first relay's entry in a running node's status.
    static func relayStatus(_ store: String) -> NodeRelays.Node.Relay? {
        guard let result = try? Nodes.cli(store, ["status", "--json"]), result.status == 0 else { return nil }
        let decoder = JSONDecoder()
        decoder.dateDecodingStrategy = .iso8601
        return (try? decoder.decode(NodeRelays.self, from: Data(result.stdout.utf8)))?.node?.relays?.first
    }
}

/// A relay killed with SIGKILL while devices upload and it forwards; strangers, garbage,
/// oversize frames, a thousand idle connections and a member over its quota against a relay.
@Suite("Relay reliability", .ownThread, .serialized)
struct RelayReliabilityTests {
    @Test("SIGKILL of the relay during uploads and forwards: it restarts, nothing confirmed is lost, all converge")
    func killTheRelay() async throws {
        let stores = try await Relays.team(3, label: "peersync-relay-kill")
        let relayDirectory = try makeTemporaryDirectory("peersync-relay-kill")
        defer { (stores + [relayDirectory]).forEach(removeTemporaryDirectory) }
        var (relay, port, code) = try Relays.start(relayDirectory)
        let address = "127.0.0.1:\(port)"
        try #require(try Nodes.cli(stores[0], ["relays", "add", address, code]).status == 0)
        // Two devices that never meet: they sync only through the relay.
        let a = try Relays.node(stores[0], relays: [address])
        let b = try Relays.node(stores[1], relays: [address])
        defer { a.kill(SIGTERM); b.kill(SIGTERM) }
        #expect(await eventually { Nodes.converged(Array(stores[0...1])) })
        var rng = SeededGenerator(seed: baseSeed &+ 33)
        for trial in 0..<Nodes.trials {
            let bulk = try Nodes.bulkFile(count: 150)
            defer { try? FileManager.default.removeItem(atPath: bulk) }
            try Nodes.cli(stores[trial % 2], ["import", bulk])
            try Nodes.cli(stores[(trial + 1) % 2], ["location", "add", "--name", "trial \(trial)"])
            // Somewhere within the upload and the forward.
            try await Task.sleep(for: .milliseconds(Int.random(in: 0...150, using: &rng)))
            relay.kill(SIGKILL)
            (relay, _, _) = try Relays.start(relayDirectory, port: port)
            #expect(await eventually { Nodes.converged(Array(stores[0...1])) }, "trial \(trial)")
            #expect(await eventually { Relays.relayStatus(stores[0])?.pending == 0 && Relays.relayStatus(stores[1])?.pending == 0 },
                    "trial \(trial): uploads not confirmed")
        }
        // What the devices were told is stored is there: a third device that reaches only the
        // relay, with both others stopped, gets all of it.
        a.kill(SIGTERM)
        b.kill(SIGTERM)
        let c = try Relays.node(stores[2], relays: [address])
        defer { c.kill(SIGTERM) }
        #expect(await eventually { Nodes.converged(stores) })
        print("reliability: relay killed \(Nodes.trials) times during uploads and forwards; all converged")
        relay.kill(SIGTERM)
    }

    /// Opens a TCP connection to `port` that does nothing (kept until the returned channel closes).
    static func idle(port: Int) async throws -> any Channel {
        try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton).connectTimeout(.seconds(3))
            .connect(host: "127.0.0.1", port: port).get()
    }

    @Test("strangers, garbage, oversize frames, 1,000 idle connections and a member over its quota: the relay stays up and serves")
    func hostileClients() async throws {
        let honest = try await Relays.team(2, label: "peersync-relay-honest")
        let greedy = try await Relays.team(2, label: "peersync-relay-greedy")
        let relayDirectory = try makeTemporaryDirectory("peersync-relay-hostile")
        defer { (honest + greedy + [relayDirectory]).forEach(removeTemporaryDirectory) }
        // Every client here is on 127.0.0.1: the per-address limit is raised so the idle
        // connections and the strangers reach TLS and the decoders (the limit has tests of its own).
        let (relay, port, code) = try Relays.start(relayDirectory, extra: ["--group-bytes", "400000", "--max-connections-per-address", "4096"])
        defer { relay.kill(SIGTERM) }
        let address = "127.0.0.1:\(port)"
        for store in [honest[0], greedy[0]] { try #require(try Nodes.cli(store, ["relays", "add", address, code]).status == 0) }
        try Nodes.cli(greedy[0], ["location", "add", "--name", "stored before the attack"])
        let nodes = try (honest + [greedy[0]]).map { try Relays.node($0, relays: [address]) }
        defer { for node in nodes { node.kill(SIGTERM) } }
        #expect(await eventually { Nodes.converged(honest) })
        #expect(await eventually { Relays.relayStatus(greedy[0])?.pending == 0 })
        let memoryBefore = try #require(HostilePeerTests.residentKilobytes(relay.pid))

        // A thousand connections that never say anything.
        var idle: [any Channel] = []
        for _ in 0..<1_000 { idle.append(try await Self.idle(port: port)) }
        // Strangers: garbage before TLS; a stranger's device that says hello to a group, announces
        // a 4 GiB frame, or uploads.
        let stranger = try DeviceTLS(key: DeviceKey.generate()) { _ in true }
        var rng = SeededGenerator(seed: baseSeed &+ 34)
        let groupID = try #require(GroupID(bytes: Array(repeating: 9, count: 16)))
        for round in 0..<200 {
            switch round % 4 {
            case 0:
                try await HostilePeerTests.connect(port: port, tls: nil, chunks: [(0..<512).map { _ in UInt8.random(in: 0...255, using: &rng) }])
            case 1:
                try await HostilePeerTests.connect(port: port, tls: stranger, chunks: [[0xff, 0xff, 0xff, 0xff, 0x0f]])
            case 2:
                try await HostilePeerTests.connect(port: port, tls: stranger, chunks: [Frame.encode(type: 64, body: [1] + groupID.bytes + [0, 0])])
            default:
                try await HostilePeerTests.connect(port: port, tls: stranger, chunks: [
                    Frame.encode(type: 65, body: (0..<Int.random(in: 0...300, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }),
                ])
            }
        }
        // A member over its group's quota: 400 kB fills with a bulk import; the rest is refused.
        let bulk = try Nodes.bulkFile(count: 3_000)
        defer { try? FileManager.default.removeItem(atPath: bulk) }
        try Nodes.cli(greedy[0], ["import", bulk])

        // Honest devices of the other group keep syncing through the relay, both ways, while
        // the idle connections are still open.
        try Nodes.cli(honest[0], ["location", "add", "--name", "during the attack"])
        #expect(await eventually { Nodes.status(honest[1])?.records["locations"] == 1 })
        try Nodes.cli(honest[1], ["location", "add", "--name", "reply"])
        #expect(await eventually { Nodes.converged(honest) })
        let memoryAfter = try #require(HostilePeerTests.residentKilobytes(relay.pid))
        print("reliability: relay under 1,000 idle connections and 200 hostile ones: RSS \(memoryBefore) KiB → \(memoryAfter) KiB")
        #expect(memoryAfter - memoryBefore < 128 * 1024, "relay memory grew by \(memoryAfter - memoryBefore) KiB")
        for channel in idle { try? await channel.close() }

        // Nothing the greedy group stored before is lost: its second device, reaching only the
        // relay, gets the record stored before the attack.
        let second = try Relays.node(greedy[1], relays: [address])
        defer { second.kill(SIGTERM) }
        #expect(await eventually { (Nodes.status(greedy[1])?.records["locations"] ?? 0) == 1 })
    }
}
