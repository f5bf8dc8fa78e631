import Foundation
import GRDB
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import PeerSyncStore
import PeerSyncTestSupport
import Testing
import ShiftSchedulerModel

/// The store's side of compaction (issue 13) on real database files: purging in batches,
/// returning space, persisting the gossip and `P`, and surviving kill -9 mid-run.
@Suite("Store compaction", .ownThread)
struct CompactionStoreTests {
    /// The database file's size after a full checkpoint (the WAL folded in and truncated).
    func checkpointedBytes(_ directory: String) throws -> Int {
        let path = ReplicaStore.path(in: directory)
        let queue = try DatabaseQueue(path: path)
        try queue.writeWithoutTransaction { db in _ = try Row.fetchOne(db, sql: "PRAGMA wal_checkpoint(TRUNCATE)") }
        try queue.close()
        return (try FileManager.default.attributesOfItem(atPath: path)[.size] as? Int) ?? 0
    }

    /// `count` locations in one transaction; returns their keys.
    func writeLocations(_ store: ReplicaStore, count: Int, prefix: String = "place") throws -> [RecordKey] {
        var keys: [RecordKey] = []
        try store.write { state in
            var delta = RecordMap.empty()
            for i in 0..<count {
                let location = Location(name: "\(prefix) \(i)", address: String(repeating: "street \(i) ", count: 8))
                keys.append(location.recordKey)
                if let d = try state.save(location) { delta.merge(d) }
            }
            return delta
        }
        return keys
    }

    func deleteAll(_ store: ReplicaStore, _ keys: [RecordKey]) throws {
        try store.write { state in
            var delta = RecordMap.empty()
            for key in keys { if let d = state.delete(key) { delta.merge(d) } }
            return delta
        }
    }

    @Test("2,000 records written and deleted: compaction purges them in batches and the file returns to within 10 % of an empty store's")
    func purgeReturnsSpace() throws {
        let emptyDir = try makeTemporaryDirectory()
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(emptyDir); removeTemporaryDirectory(dir) }
        _ = try ReplicaStore.create(directory: emptyDir, name: "empty")
        let emptyBytes = try checkpointedBytes(emptyDir)
        let emptyState = try ReplicaStore.open(directory: emptyDir).state.records.encoded().count

        let store = try ReplicaStore.create(directory: dir, name: "busy")
        let keys = try writeLocations(store, count: 2_000)
        try deleteAll(store, keys)
        // What a peer that never compacted would send (a full-state repair): every deleted record.
        let staleFull = store.state.delta(missingFrom: CausalContext())
        let fullBytes = try checkpointedBytes(dir)
        #expect(store.state.records.invisibleRecordCount == 2_000)

        var batches = 0
        let run = try store.compact(stable: store.state.context, batchSize: 300) { _ in
            batches += 1
            return true
        }
        #expect(run.purgedRecords == 2_000)
        #expect(run.batches == 7)  // 6 full batches of 300 and the rest
        #expect(run.remainingDeleted == 0)
        #expect(store.state.records.recordCount == 0)
        let afterBytes = try checkpointedBytes(dir)
        #expect(afterBytes <= emptyBytes + emptyBytes / 10, "after \(afterBytes) B, empty \(emptyBytes) B, full \(fullBytes) B")
        // In memory: the state holds one context entry, like a replica that wrote once.
        let afterState = store.state.records.encoded().count
        #expect(afterState <= emptyState + 64, "state \(afterState) B, empty \(emptyState) B")

        // Reopened: nothing comes back, P is restored, and a late copy of the old writes is dropped.
        let reopened = try ReplicaStore.open(directory: dir)
        #expect(reopened.state.records.recordCount == 0)
        #expect(reopened.compaction.frontier.stable == store.state.context)
        #expect(reopened.compaction.purgedRecords == 2_000)
        try reopened.applyRemote(staleFull, from: "peer:late")
        #expect(reopened.state.records.recordCount == 0)
        let before = try ReplicaStore.create(directory: try makeTemporaryDirectory(), name: "other", replicaID: testReplica(8))
        let staleKeys = try writeLocations(before, count: 3, prefix: "other")
        // Records it never held are taken as usual.
        try reopened.applyRemote(before.state.delta(missingFrom: CausalContext()), from: "peer:new")
        #expect(staleKeys.allSatisfy { reopened.state.contains($0) })
        removeTemporaryDirectory(before.directory!)
    }

    @Test("live records, unstable deletions and concurrent edits are left alone")
    func onlyStableDeletionsGo() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        let store = try ReplicaStore.create(directory: dir, name: "n")
        let live = try writeLocations(store, count: 50, prefix: "live")
        let doomed = try writeLocations(store, count: 50, prefix: "doomed")
        try deleteAll(store, doomed)
        let stable = store.state.context
        let later = try writeLocations(store, count: 10, prefix: "later")
        try deleteAll(store, later)  // deleted after the stable context was taken
        let run = try store.compact(stable: stable, batchSize: 7)
        #expect(run.purgedRecords == 50)
        #expect(run.remainingDeleted == 10)
        #expect(live.allSatisfy { store.state.contains($0) })
        #expect(later.allSatisfy { store.state.records.record($0) != nil })
        let reopened = try ReplicaStore.open(directory: dir)
        #expect(reopened.state.digest == store.state.digest)
        #expect(reopened.state.records.recordCount == 60)
    }

    @Test("a store made before incremental vacuum switches on its first compaction")
    func existingStoreSwitchesToIncrementalVacuum() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        do {
            let store = try ReplicaStore.create(directory: dir, name: "old")
            try deleteAll(store, try writeLocations(store, count: 500))
        }
        let queue = try DatabaseQueue(path: ReplicaStore.path(in: dir))
        try queue.writeWithoutTransaction { db in
            try db.execute(sql: "PRAGMA auto_vacuum = NONE")
            try db.execute(sql: "VACUUM")
        }
        #expect(try queue.read { try Int.fetchOne($0, sql: "PRAGMA auto_vacuum") } == 0)
        try queue.close()
        let store = try ReplicaStore.open(directory: dir)
        let run = try store.compact(stable: store.state.context)
        #expect(run.purgedRecords == 500)
        #expect(run.bytesAfter < run.bytesBefore, "\(run.bytesBefore) → \(run.bytesAfter)")
        let check = try DatabaseQueue(path: ReplicaStore.path(in: dir))
        #expect(try check.read { try Int.fetchOne($0, sql: "PRAGMA auto_vacuum") } == 2)
        try check.close()
    }

    @Test("signed reports and own reports persist across reopening; the newest per replica wins; a report of our own replica we did not sign is our lost future's")
    func gossipPersists() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        let store = try ReplicaStore.create(directory: dir, name: "n")
        _ = try writeLocations(store, count: 3)
        let peer = testReplica(3)
        func report(_ replica: ReplicaID, time: UInt64, _ context: CausalContext, signature: UInt8 = 1) -> SeenReport {
            SeenReport(groupID: Array(repeating: 1, count: 16), device: Array(repeating: 2, count: 20), replica: replica, time: time,
                       context: context, signature: Array(repeating: signature, count: 64))
        }
        let peerSeen = CausalContext(versionVector: [peer: 5, store.replicaID: 2])
        #expect(try store.recordSeen([report(peer, time: 1_000, peerSeen)]).grew)
        #expect(try !store.recordSeen([report(peer, time: 1_000, peerSeen)]).grew)  // nothing new
        #expect(try !store.recordSeen([report(peer, time: 900, CausalContext(versionVector: [peer: 9]))]).grew)  // older
        let own = report(store.replicaID, time: 2_000, store.state.context)
        try store.saveOwnReport(own)
        // Our own report coming back changes nothing; one we did not sign is our lost future's.
        #expect(try store.recordSeen([own]) == RecordedReports())
        let lost = report(store.replicaID, time: 2_500, CausalContext(versionVector: [store.replicaID: 9]), signature: 3)
        #expect(try store.recordSeen([lost]).fromLostFuture == [lost])
        #expect(try store.recordSeen([report(store.replicaID, time: 1_500, CausalContext(), signature: 4)]).fromLostFuture.isEmpty,
                "older than the last report we signed: ours, relayed late")

        let reopened = try ReplicaStore.open(directory: dir)
        let record = reopened.compaction
        #expect(record.reportedContexts == [peer: peerSeen])
        #expect(record.reportedAt(peer) == 1_000)
        #expect(record.ownReports[reopened.replicaID] == own)
        #expect(Set(reopened.seenReports()) == [report(peer, time: 1_000, peerSeen), own])

        try reopened.retainSeen { $0 != peer }
        #expect(try ReplicaStore.open(directory: dir).compaction.reports.isEmpty)
        // A frontier with a candidate survives a restart.
        var frontier = CompactionFrontier()
        frontier.advance(members: [reopened.replicaID: MemberView(seen: reopened.state.context, ownReplicas: [reopened.replicaID])])
        #expect(frontier.candidate != nil)
        try reopened.saveFrontier(frontier)
        #expect(try ReplicaStore.open(directory: dir).compaction.frontier.candidate == frontier.candidate)
    }

    @Test("SIGKILL at a random instant of a compaction: the store opens, nothing live is lost, the next compaction finishes", arguments: 0..<10)
    func killNineDuringCompaction(trial: Int) throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        let store = try ReplicaStore.create(directory: dir, name: "victim")
        let live = try writeLocations(store, count: 300, prefix: "live")
        try deleteAll(store, try writeLocations(store, count: 1_500, prefix: "doomed"))
        let liveDigest = store.state.records.delta(missingFrom: CausalContext()).allRecords.filter { $0.1.isVisible }.count
        var rng = SeededGenerator(seed: baseSeed &+ UInt64(trial))
        let killAfter = Int.random(in: 0...25, using: &rng)  // batches of 50 of 1,500: 31 in all
        let child = try ChildProcess(buildProductsDirectory().appendingPathComponent("peersync-store-child").path,
                                     ["compact", dir])
        var lines = 0
        let deadline = ContinuousClock.now + .seconds(60)
        while lines < killAfter, let line = child.readLine(until: deadline) {
            if line.hasPrefix("batch") { lines += 1 }
        }
        child.kill(SIGKILL)
        _ = child.wait(timeout: .seconds(10))
        let reopened = try ReplicaStore.open(directory: dir)
        #expect(live.allSatisfy { reopened.state.contains($0) }, "seed \(baseSeed &+ UInt64(trial))")
        #expect(liveDigest == 300)
        let run = try reopened.compact(stable: reopened.state.context)
        #expect(run.remainingDeleted == 0)
        #expect(reopened.state.records.recordCount == 300)
        #expect(try ReplicaStore.open(directory: dir).state.digest == reopened.state.digest)
    }
}
