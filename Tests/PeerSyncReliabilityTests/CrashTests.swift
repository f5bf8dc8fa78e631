import Foundation
import PeerSyncTestSupport
import Testing

/// SIGKILL of `peersync run` processes at random instants; nothing the CLI reported committed
/// may be lost, and everyone converges after the restart.
@Suite("Crashes", .ownThread, .serialized)
struct CrashTests {
    @Test("SIGKILL during catch-up: the store reopens, and the restarted node converges")
    func killDuringCatchUp() async throws {
        let stores = try Nodes.group(2, label: "peersync-crash")
        defer { stores.forEach(removeTemporaryDirectory) }
        let bulk = try Nodes.bulkFile(count: 20_000)
        defer { try? FileManager.default.removeItem(atPath: bulk) }
        let imported = try Nodes.cli(stores[0], ["import", bulk])
        try #require(imported.status == 0, "\(imported.stderr)")
        let source = try Nodes.start(stores[0])
        defer { source.kill(SIGTERM) }
        let a = try await Nodes.address(stores[0], pid: source.pid)
        var rng = SeededGenerator(seed: baseSeed)
        for trial in 0..<Nodes.trials {
            // A fresh peer starts catching up 20,000 records and is killed at a random instant.
            let victim = try Nodes.start(stores[1], peers: [a])
            let delay = Int.random(in: 50...700, using: &rng)
            _ = await eventually(timeout: .milliseconds(delay), every: .milliseconds(delay)) { false }
            victim.kill(SIGKILL)
            // Whatever it committed is a consistent store: it opens and answers.
            let after = try #require(Nodes.status(stores[1]), "store unreadable after SIGKILL in trial \(trial)")
            #expect(after.records["shiftTypes", default: 0] <= 20_000)
            // Between trials, remove nothing: the next trial resumes from what was committed.
        }
        let last = try Nodes.start(stores[1], peers: [a])
        defer { last.kill(SIGTERM) }
        #expect(await eventually(timeout: .seconds(60)) { Nodes.converged(stores) })
        #expect(Nodes.status(stores[1])?.records["shiftTypes"] == 20_000)
    }

    @Test("SIGKILL during live streams: every reported commit survives and everyone converges")
    func killDuringLiveStream() async throws {
        let stores = try Nodes.group(3, label: "peersync-crash-live")
        defer { stores.forEach(removeTemporaryDirectory) }
        var nodes = try stores.map { try Nodes.start($0) }
        defer { nodes.forEach { $0.kill(SIGTERM) } }
        var addresses: [String] = []
        for (i, store) in stores.enumerated() { addresses.append(try await Nodes.address(store, pid: nodes[i].pid)) }
        // Re-start 1 and 2 dialing 0 (and 2 dialing 1), now that the addresses are known.
        for i in 1...2 {
            nodes[i].kill(SIGTERM)
            nodes[i] = try Nodes.start(stores[i], peers: Array(addresses[0..<i]))
            addresses[i] = try await Nodes.address(stores[i], pid: nodes[i].pid)
        }
        var committed: [(store: Int, id: String)] = []
        var rng = SeededGenerator(seed: baseSeed &+ 7)
        for trial in 0..<Nodes.trials {
            // Writers on every store while one node (not the writer processes) is killed mid-stream.
            let victim = Int.random(in: 0..<3, using: &rng)
            try await withThrowingTaskGroup(of: [(Int, String)].self) { group in
                for s in 0..<3 {
                    group.addTask {
                        var mine: [(Int, String)] = []
                        for n in 0..<4 {
                            let result = try Nodes.cli(stores[s], ["location", "add", "--name", "trial \(trial) store \(s) #\(n)"])
                            if result.status == 0 { mine.append((s, result.stdout.trimmingCharacters(in: .whitespacesAndNewlines))) }
                        }
                        return mine
                    }
                }
                _ = await eventually(timeout: .milliseconds(Int.random(in: 20...200, using: &rng)), every: .milliseconds(10)) { false }
                nodes[victim].kill(SIGKILL)
                for try await batch in group { committed += batch }
            }
            nodes[victim] = try Nodes.start(stores[victim], peers: Array(addresses[0..<victim]))
            addresses[victim] = try await Nodes.address(stores[victim], pid: nodes[victim].pid)
            if victim == 0 {
                // The others dial the old address of node 0; re-point them.
                for i in 1...2 {
                    nodes[i].kill(SIGTERM)
                    nodes[i] = try Nodes.start(stores[i], peers: Array(addresses[0..<i]))
                    addresses[i] = try await Nodes.address(stores[i], pid: nodes[i].pid)
                }
            }
        }
        #expect(await eventually(timeout: .seconds(60)) { Nodes.converged(stores) })
        for store in stores {
            let listed = try Nodes.cli(store, ["location", "list", "--json"]).stdout
            let lost = committed.filter { !listed.contains($0.id) }
            #expect(lost.isEmpty, "\(lost.count) of \(committed.count) reported commits missing on \(store)")
        }
        #expect(committed.count == Nodes.trials * 12)
    }
}
