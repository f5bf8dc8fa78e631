import Foundation
import GRDB
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import PeerSyncStore
import PeerSyncTestSupport
import Testing
import ShiftSchedulerModel

/// Real database files in temporary folders.
@Suite("Replica store", .ownThread)
struct StoreTests {
    /// Random local writes, deletes, settings and remote deltas (with conflicts) into `store`.
    func randomHistory(_ store: ReplicaStore, seed: UInt64) throws {
        var rng = SeededGenerator(seed: seed)
        var remote = ReplicaState(replicaID: testReplica(9), name: "remote", physicalClock: { 4_000_000_000_000 })
        let ids = (0..<20).map { _ in UUID() }
        for step in 0..<150 {
            let id = ids.randomElement(using: &rng)!
            switch Int.random(in: 0..<10, using: &rng) {
            case 0..<5:
                try store.write { state in
                    state.upsert(["name": .string("n\(step)"), "address": .int(Int64(step))], to: RecordKey(collection: "locations", id: id))
                }
            case 5: try store.write { $0.delete(RecordKey(collection: "locations", id: id)) }
            case 6: try store.write { $0.setSetting("k\(step % 3)", to: .int(Int64(step)), scope: .local) }
            case 7: try store.write { $0.setSetting("s\(step % 3)", to: .int(Int64(step)), scope: .synced) }
            default:
                remote.apply(store.state.delta(missingFrom: remote.context))
                let delta = remote.upsert(["name": .string("remote \(step)")], to: RecordKey(collection: "locations", id: id))
                if let delta { try store.applyRemote(delta, from: "peer:test") }
            }
        }
    }

    @Test("reopen gives the same state, digest, settings, name and conflicts")
    func reopenEquals() throws {
        for trial in 0..<UInt64(3) {
            let dir = try makeTemporaryDirectory()
            defer { removeTemporaryDirectory(dir) }
            let store = try ReplicaStore.create(directory: dir, name: "reopen")
            try randomHistory(store, seed: baseSeed &+ trial)
            let before = store.state
            let reopened = try ReplicaStore.open(directory: dir)
            let after = reopened.state
            #expect(after.records == before.records, "seed \(baseSeed &+ trial)")
            #expect(after.digest == before.digest)
            #expect(after.localSettings == before.localSettings && !after.localSettings.isEmpty)
            #expect(after.name == "reopen" && after.replicaID == before.replicaID)
            #expect(after.conflicts.entries == before.conflicts.entries)
            #expect(try reopened.conflicts().count == before.conflicts.entries.count)
            #expect(after.clock.latest >= before.records.maxTimestamp)
        }
    }

    @Test("a body that throws writes nothing, on disk or in memory")
    func failedBodyWritesNothing() throws {
        struct Refused: Error {}
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        let store = try ReplicaStore.create(directory: dir, name: "x")
        try store.write { try $0.save(Location(name: "kept")) }
        let digest = store.state.digest
        #expect(throws: Refused.self) {
            try store.write { state in
                try state.save(Location(name: "never"))
                throw Refused()
            }
        }
        #expect(store.state.digest == digest)
        #expect(try ReplicaStore.open(directory: dir).state.digest == digest)
    }

    @Test("a duplicate remote delta writes nothing")
    func duplicateDeltaNoCommit() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        let store = try ReplicaStore.create(directory: dir, name: "x")
        var remote = ReplicaState(replicaID: testReplica(5), name: "r")
        let delta = try must(remote.save(Location(name: "from remote")))
        #expect(try !store.applyRemote(delta, from: "peer").isEmpty)
        let entries = try store.journal().count
        #expect(try store.applyRemote(delta, from: "peer").isEmpty)
        #expect(try store.journal().count == entries)
    }

    @Test("a delta repeating records the store holds rewrites only the rows of records it changes")
    func repeatedRecordsNotRewritten() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        let store = try ReplicaStore.create(directory: dir, name: "x")
        var remote = ReplicaState(replicaID: testReplica(5), name: "r")
        for i in 0..<100 { _ = try remote.save(Location(name: "held \(i)")) }
        try store.applyRemote(remote.delta(missingFrom: CausalContext()), from: "peer:first")
        for i in 0..<5 { _ = try remote.save(Location(name: "new \(i)")) }
        // Count row writes from here on (a second connection adds the trigger; the store's
        // statements pick up the schema change).
        try DatabaseQueue(path: ReplicaStore.path(in: dir)).write { db in
            try db.execute(sql: """
                CREATE TABLE rowWrites (n INTEGER NOT NULL); INSERT INTO rowWrites VALUES (0);
                CREATE TRIGGER countRowWrites AFTER INSERT ON record BEGIN UPDATE rowWrites SET n = n + 1; END;
                """)
        }
        // The whole state again, as a second peer's round would bring it: 100 held, 5 new.
        let outcome = try store.applyRemote(remote.delta(missingFrom: CausalContext()), from: "peer:second")
        #expect(outcome.changedRecords.count == 5)
        let written = try DatabaseQueue(path: ReplicaStore.path(in: dir)).read { try Int.fetchOne($0, sql: "SELECT n FROM rowWrites") }
        #expect(written == 5)
        #expect(try store.state.fetchAll(Location.self).count == 105)
    }

    @Test("another process's commits are seen as deltas, without reloading the store")
    func secondProcessWritesWhileFirstObserves() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        let store = try ReplicaStore.create(directory: dir, name: "observer")
        try store.write { try $0.save(Location(name: "before")) }
        let child = try ChildProcess(buildProductsDirectory().appendingPathComponent("peersync-store-child").path,
                                     ["write", dir, "200"])
        var seen = 0
        var reloads = 0
        let deadline = ContinuousClock.now + .seconds(60)
        while seen < 200 && ContinuousClock.now < deadline {
            for change in try store.refresh() {
                if change.delta == nil { reloads += 1 }
            }
            seen = try store.state.fetchAll(Location.self).filter { $0.name.hasPrefix("child ") }.count
            _ = child.readLine(until: .now + .milliseconds(2))
        }
        #expect(child.wait(timeout: .seconds(30)) == 0)
        _ = try store.refresh()
        #expect(try store.state.fetchAll(Location.self).count == 201)
        #expect(reloads == 0)
        // The observer's own writes interleave with the child's without losing either.
        try store.write { try $0.save(Location(name: "after")) }
        let reopened = try ReplicaStore.open(directory: dir)
        #expect(try reopened.state.fetchAll(Location.self).count == 202)
        #expect(reopened.state.digest == store.state.digest)
    }

    @Test("another process's commits joined inside this process's own transaction are still reported")
    func absorbedChangesAreReported() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        let node = try ReplicaStore.create(directory: dir, name: "node")
        let cli = try ReplicaStore.open(directory: dir)  // a second connection, as the CLI's process has
        let fromCLI = Location(name: "written by the CLI")
        try cli.write { try $0.save(fromCLI) }
        // The node commits something of its own before it looks for external changes...
        try node.write { try $0.save(Location(name: "written by the node")) }
        #expect(node.state.contains(fromCLI.recordKey))
        // ...and refresh() still reports the CLI's commit, so the node ships it to peers.
        let reported = try node.refresh().compactMap(\.delta).flatMap { $0.allRecords.map(\.0) }
        #expect(reported.contains(fromCLI.recordKey))
        #expect(try node.refresh().isEmpty)
    }

    @Test("SIGKILL in the middle of a stream of writes loses no reported commit", arguments: 0..<10)
    func killNineLosesNothing(trial: Int) throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        _ = try ReplicaStore.create(directory: dir, name: "victim")
        var rng = SeededGenerator(seed: baseSeed &+ UInt64(trial))
        let killAfter = Int.random(in: 1...300, using: &rng)
        let child = try ChildProcess(buildProductsDirectory().appendingPathComponent("peersync-store-child").path,
                                     ["write", dir, "100000"])
        var committed: [UUID] = []
        let deadline = ContinuousClock.now + .seconds(60)
        while committed.count < killAfter, let line = child.readLine(until: deadline) {
            if let id = line.split(separator: " ").last.flatMap({ UUID(uuidString: String($0)) }) { committed.append(id) }
        }
        child.kill(SIGKILL)
        // Lines already in the pipe were printed after their commit: they count too.
        while let line = child.readLine(until: .now + .seconds(5)) {
            if let id = line.split(separator: " ").last.flatMap({ UUID(uuidString: String($0)) }) { committed.append(id) }
        }
        #expect(committed.count >= killAfter, "child stopped early (seed \(baseSeed &+ UInt64(trial)))")
        let reopened = try ReplicaStore.open(directory: dir)
        let present = Set(try reopened.state.fetchAll(Location.self).map(\.id))
        let lost = committed.filter { !present.contains($0) }
        #expect(lost.isEmpty, "\(lost.count) of \(committed.count) reported commits lost (seed \(baseSeed &+ UInt64(trial)))")
        // And the store is still writable.
        try reopened.write { try $0.save(Location(name: "after the crash")) }
    }
}
