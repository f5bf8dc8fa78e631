import Foundation
import PeerSyncTestSupport
import Testing

let peersync = buildProductsDirectory().appendingPathComponent("peersync").path

@discardableResult
func cli(_ arguments: String..., store: String? = nil) throws -> CommandResult {
    try runCommand(peersync, (store.map { ["--store", $0] } ?? []) + arguments)
}

/// `cli` with `--store` placed after the subcommand path (ArgumentParser wants options there).
@discardableResult
func cli(in store: String, _ arguments: [String]) throws -> CommandResult {
    try runCommand(peersync, arguments + ["--store", store])
}

struct StatusJSON: Decodable {
    struct Node: Decodable {
        struct Peer: Decodable { var replicaID: String; var lastConvergedAt: String? }
        var pid: Int32
        var listen: String
        var peers: [Peer]
    }
    var replicaID: String
    var deviceID: String
    var role: String
    var removal: String?
    var digest: String
    var records: [String: Int]
    var node: Node?
}

func status(_ store: String) throws -> StatusJSON {
    let result = try cli(in: store, ["status", "--json"])
    return try JSONDecoder().decode(StatusJSON.self, from: Data(result.stdout.utf8))
}

@Suite("peersync command", .ownThread)
struct CLITests {
    @Test("help of the command and of every subcommand", arguments: [
        [], ["init"], ["invite"], ["run"], ["location"], ["location", "add"], ["location", "set"], ["location", "rm"],
        ["location", "list"], ["location", "show"], ["shift-type"], ["shift-type", "add"], ["shift-type", "set"],
        ["shift-type", "rm"], ["shift-type", "list"], ["shift-type", "show"], ["settings"], ["settings", "set"],
        ["settings", "get"], ["settings", "unset"], ["settings", "list"], ["status"], ["log"], ["conflicts"],
        ["watch"], ["export"], ["import"], ["bundle"], ["bundle", "create"], ["bundle", "apply"], ["bundle", "context"],
        ["demo"], ["doctor"],
    ])
    func help(_ path: [String]) throws {
        let result = try runCommand(peersync, path + ["--help"])
        #expect(result.status == 0)
        #expect(result.stdout.contains("USAGE: peersync" + path.map { " " + $0 }.joined()), "\(result.stdout)")
        #expect(result.stdout.contains("OVERVIEW:"))
    }

    @Test("errors are one line on stderr, a non-zero exit, and change nothing")
    func errors() throws {
        let store = try makeTemporaryDirectory("peersync-cli")
        defer { removeTemporaryDirectory(store) }
        try #require(try cli(in: store, ["init", "--name", "a"]).status == 0)
        let location = try cli(in: store, ["location", "add", "--name", "Ward 3"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let before = try status(store).digest
        let missingParent = try makeTemporaryDirectory("peersync-missing")
        defer { removeTemporaryDirectory(missingParent) }
        let missing = missingParent + "/nothing"
        let cases: [([String], String, String?)] = [
            (["location", "set", UUID().uuidString, "--name", "x"], "no location with ID", store),
            (["shift-type", "add", "--symbol", "E", "--title", "Early", "--duration", "8 hours"], "invalid duration", store),
            (["shift-type", "add", "--symbol", "E", "--title", "Early", "--duration", "8h", "--location", UUID().uuidString], "no location with ID", store),
            (["location", "list"], "no replica at", missing),
            (["init"], "already holds replica", store),
            (["init", "--join", "PS1-NOT-A-CODE"], "invalid invite code", missing),
            (["doctor", "--peer", "127.0.0.1:1"], "peer 127.0.0.1:1", store),
            (["location", "rm", "not-a-uuid"], "not a location ID", store),
        ]
        for (arguments, message, dir) in cases {
            let result = try cli(in: dir ?? store, arguments)
            #expect(result.status != 0, "\(arguments) succeeded")
            let text = result.stderr + result.stdout
            #expect(text.contains(message), "\(arguments): \(text)")
            if arguments.first != "doctor" {
                #expect(result.stderr.trimmingCharacters(in: .whitespacesAndNewlines).split(separator: "\n").count == 1,
                        "\(arguments) printed more than one line: \(result.stderr)")
            }
        }
        #expect(try status(store).digest == before)
        #expect(!FileManager.default.fileExists(atPath: missing))
        #expect(try cli(in: store, ["location", "show", location, "--json"]).stdout.contains("Ward 3"))
    }

    @Test("no avahi daemon reachable: the node says so in one line and syncs through --peer")
    func noDaemon() async throws {
        let stores = try (0..<2).map { _ in try makeTemporaryDirectory("peersync-nodaemon") }
        defer { stores.forEach(removeTemporaryDirectory) }
        try #require(try cli(in: stores[0], ["init", "--name", "a"]).status == 0)
        let code = try cli(in: stores[0], ["invite"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        try #require(try cli(in: stores[1], ["init", "--name", "b", "--join", code]).status == 0)
        // D-Bus pointed at a socket that does not exist: no daemon can be reached, real or not.
        var environment = ProcessInfo.processInfo.environment
        environment["DBUS_SYSTEM_BUS_ADDRESS"] = "unix:path=/nonexistent/peersync-test-bus"
        let a = try ChildProcess(peersync, ["run", "--store", stores[0], "--listen", "127.0.0.1:0", "--log-level", "warning"],
                                 environment: environment, captureStandardError: true)
        var address: String?
        _ = await eventually { address = try? status(stores[0]).node?.listen; return address != nil }
        let b = try ChildProcess(peersync, ["run", "--store", stores[1], "--listen", "127.0.0.1:0", "--log-level", "warning",
                                            "--peer", try #require(address)], environment: environment)
        defer { a.kill(SIGTERM); b.kill(SIGTERM) }
        try cli(in: stores[1], ["location", "add", "--name", "via the static peer"])
        #expect(await eventually { (try? status(stores[0]).records["locations"]) == 1 })
        a.kill(SIGTERM)
        let lines = a.standardErrorLines()
        let discoveryLines = lines.filter { $0.contains("discovery unavailable") }
        #expect(discoveryLines.count == 1, "\(lines)")
        #expect(discoveryLines.first?.contains("no avahi daemon reachable") == true)
        #expect(discoveryLines.first?.contains("static peers still work") == true)
    }

    @Test("a removed device's own `status` says it was removed, by whom and when, while its node runs")
    func removedDeviceStatus() async throws {
        let stores = try (0..<2).map { _ in try makeTemporaryDirectory("peersync-removed") }
        var nodes: [ChildProcess] = []
        defer {
            for node in nodes { node.kill(SIGTERM) }
            stores.forEach(removeTemporaryDirectory)
        }
        try #require(try cli(in: stores[0], ["init", "--name", "a"]).status == 0)
        let code = try cli(in: stores[0], ["invite"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        try #require(try cli(in: stores[1], ["init", "--name", "d", "--join", code]).status == 0)
        nodes.append(try ChildProcess(peersync, ["run", "--store", stores[0], "--listen", "127.0.0.1:0", "--log-level", "warning",
                                                 "--no-discovery"]))
        var address: String?
        _ = await eventually { address = try? status(stores[0]).node?.listen; return address != nil }
        nodes.append(try ChildProcess(peersync, ["run", "--store", stores[1], "--listen", "127.0.0.1:0", "--log-level", "warning",
                                                 "--no-discovery", "--peer", try #require(address)]))
        #expect(await eventually { (try? status(stores[1]).role) == "member" })
        let device = try status(stores[1]).deviceID
        try #require(try cli(in: stores[0], ["devices", "remove", device]).status == 0)
        #expect(await eventually { (try? status(stores[1]).role) == "removed" })
        let removed = try status(stores[1])
        #expect(removed.removal?.contains("was removed from the group by a at 20") == true, "\(removed.removal ?? "none")")
        let text = try cli(in: stores[1], ["status"]).stdout
        #expect(text.contains("— removed") && text.contains("removed   this device was removed from the group"), "\(text)")
    }

    @Test("three `peersync run` nodes converge; one is killed with SIGKILL, edits go on, it restarts and catches up")
    func threeNodes() async throws {
        let stores = try (0..<3).map { _ in try makeTemporaryDirectory("peersync-e2e") }
        var nodes: [ChildProcess] = []
        defer {
            for node in nodes { node.kill(SIGTERM) }
            stores.forEach(removeTemporaryDirectory)
        }
        try #require(try cli(in: stores[0], ["init", "--name", "a"]).status == 0)
        for (i, store) in stores.enumerated().dropFirst() {
            let code = try cli(in: stores[0], ["invite"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
            try #require(try cli(in: store, ["init", "--name", "n\(i)", "--join", code]).status == 0)
        }
        func startNode(_ i: Int, peers: [String]) throws -> ChildProcess {
            // --no-discovery: these nodes live in the machine's own network namespace, where they
            // must never reach (or make advertise) a real avahi daemon.
            try ChildProcess(peersync, ["run", "--store", stores[i], "--listen", "127.0.0.1:0", "--log-level", "warning",
                                        "--no-discovery"] + peers.flatMap { ["--peer", $0] })
        }
        func listenAddress(_ i: Int) async throws -> String {
            var address: String?
            _ = await eventually { address = try? status(stores[i]).node?.listen; return address != nil }
            return try #require(address)
        }
        nodes.append(try startNode(0, peers: []))
        let a = try await listenAddress(0)
        nodes.append(try startNode(1, peers: [a]))
        let b = try await listenAddress(1)
        nodes.append(try startNode(2, peers: [a, b]))
        _ = try await listenAddress(2)

        // Concurrent edits through the CLI on every store.
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (i, store) in stores.enumerated() {
                group.addTask {
                    let place = try cli(in: store, ["location", "add", "--name", "Place \(i)"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
                    for n in 0..<5 {
                        let result = try cli(in: store, ["shift-type", "add", "--symbol", "S\(i)\(n)", "--title", "Shift \(i)-\(n)",
                                                         "--duration", "\(6 + n)h", "--location", place])
                        #expect(result.status == 0, "\(result.stderr)")
                    }
                    _ = try cli(in: store, ["settings", "set", "weekStart", "\(i + 1)"])
                }
            }
            try await group.waitForAll()
        }
        func converged() throws -> Bool {
            let digests = try stores.map { try status($0).digest }
            guard Set(digests).count == 1 else { return false }
            let lists = try stores.map { try cli(in: $0, ["shift-type", "list", "--json"]).stdout }
            return Set(lists).count == 1
        }
        #expect(await eventually { (try? converged()) ?? false })
        #expect(try status(stores[0]).records["shiftTypes"] == 15)

        // Kill node 1 without warning; edit elsewhere and on its store while it is down.
        nodes[1].kill(SIGKILL)
        try cli(in: stores[0], ["shift-type", "add", "--symbol", "K0", "--title", "While 1 was dead", "--duration", "8h"])
        try cli(in: stores[2], ["location", "add", "--name", "Added on 2 while 1 was dead"])
        try cli(in: stores[1], ["shift-type", "add", "--symbol", "K1", "--title", "Offline edit on 1", "--duration", "4h"])
        nodes[1] = try startNode(1, peers: [a])
        #expect(await eventually { (try? converged()) ?? false })
        let titles = try cli(in: stores[2], ["shift-type", "list"]).stdout
        #expect(titles.contains("While 1 was dead") && titles.contains("Offline edit on 1"))
        #expect(try status(stores[1]).records["shiftTypes"] == 17)
        // A graceful stop (SIGTERM) ends the node with status 0.
        nodes[2].kill(SIGTERM)
        #expect(nodes[2].process.terminationStatus == 0)
    }
}
