import Foundation
import GRDB
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import PeerSyncStore
import PeerSyncTestSupport
import Synchronization
import Testing
import ShiftSchedulerModel

/// The store's side of a restore (issue 29): the writes made since a restore move to the new
/// replica ID, and a complete round drops what the group purged. Real database files.
@Suite("Store restores")
struct RestoreStoreTests {
    @Test("writes and deletes committed after a time move to the current replica ID, keeping values and timestamps; older ones stay")
    func movesWritesSinceRestore() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        let clock = Mutex<UInt64>(1_000_000)
        let store = try ReplicaStore.create(directory: dir, name: "n", physicalClock: { clock.withLock { $0 } })
        let old = store.replicaID
        let before = Location(name: "before")
        let doomed = Location(name: "doomed")
        try store.write { try $0.save(before) }
        try store.write { try $0.save(doomed) }
        let since = clock.withLock { $0 += 10_000; return $0 - 1 }  // the restore happens here
        let after = Location(name: "after")
        try store.write { state in
            var delta = try state.save(after)!
            delta.merge(state.delete(Location.self, id: doomed.id)!)
            return delta
        }
        let issued = store.state.context.maxCounter(of: old)
        let timestampAfter = try #require(store.state.records.record(after.recordKey)?.fields["name"]?.timestamp)
        try store.beginNewIncarnation(reason: "test")
        let current = store.replicaID
        #expect(try store.moveWritesSinceRestore(of: old, after: since) == 2)
        let state = store.state
        // The write since the restore: now the new replica's, with its timestamp and value.
        let moved = try #require(state.records.record(after.recordKey))
        #expect(moved.fields["name"]?.dot.replica == current && moved.fields["name"]?.timestamp == timestampAfter)
        #expect(moved.presence[current]?.isLive == true && moved.presence[old] == nil)
        // The delete since the restore: its removal dot is the new replica's.
        let deleted = try #require(state.records.record(doomed.recordKey))
        #expect(!deleted.isVisible && deleted.presence[old]?.removedBy?.replica == current)
        // Before the restore: untouched. The old counters since it leave the context.
        #expect(state.records.record(before.recordKey)?.fields["name"]?.dot.replica == old)
        #expect(state.context.maxCounter(of: old) == issued - 2 && state.context.maxCounter(of: current) == 2)
        // Moved once: asking again moves nothing; and it all survives reopening.
        #expect(try store.moveWritesSinceRestore(of: old, after: since) == 0)
        let reopened = try ReplicaStore.open(directory: dir)
        #expect(reopened.state.records == state.records && reopened.state.digest == state.digest)
    }

    @Test("a complete round's end drops what the peer purged (visible or not), keeps what it carried and what holds a newer dot, and remembers the stable context")
    func completeRoundDropsWhatThePeerPurged() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        let store = try ReplicaStore.create(directory: dir, name: "restored")
        let gone = Location(name: "purged by the group")
        let kept = Location(name: "still held by the peer")
        try store.write { try $0.save(gone) }
        try store.write { try $0.save(kept) }
        let stable = store.state.context
        let mine = Location(name: "written since")
        try store.write { try $0.save(mine) }
        let carried = RecordMap(records: [(kept.recordKey, store.state.records.record(kept.recordKey)!)], context: stable,
                                maintainingDigest: false)
        let (_, dropped) = try store.applyRemoteEach([carried], from: "peer:x",
                                                      completing: [CompleteRound(stable: stable, keys: [kept.recordKey])])
        #expect(dropped == [gone.recordKey])
        #expect(try store.state.fetchAll(Location.self).map(\.name).sorted() == ["still held by the peer", "written since"])
        // An echo of the dropped record is dropped too, also after reopening.
        let echo = RecordMap(records: [(gone.recordKey, RecordState(fields: ["name": FieldRegister(
            value: .string("purged by the group"), timestamp: HLCTimestamp(physicalMilliseconds: 5, logical: 0),
            dot: Dot(replica: store.replicaID, counter: 1), supersedes: .zero)]))], context: CausalContext(), maintainingDigest: false)
        let reopened = try ReplicaStore.open(directory: dir)
        #expect(reopened.state.records.record(gone.recordKey) == nil)
        try reopened.applyRemote(echo, from: "peer:y")
        #expect(reopened.state.records.record(gone.recordKey) == nil)
        #expect(reopened.compaction.frontier.stable.includes(stable))
    }

    @Test("a report of our replica that holds what we never saw is our lost future's, even when we signed a later one first")
    func lostFutureByContent() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        let store = try ReplicaStore.create(directory: dir, name: "restored")
        func report(time: UInt64, _ context: CausalContext, signature: UInt8) -> SeenReport {
            SeenReport(groupID: Array(repeating: 1, count: 16), device: Array(repeating: 2, count: 20), replica: store.replicaID,
                       time: time, context: context, signature: Array(repeating: signature, count: 64))
        }
        // Signed by the restored store after the restore, before its lost future's report arrived.
        try store.saveOwnReport(report(time: 9_000, store.state.context, signature: 1))
        var lostContext = store.state.context
        lostContext.insert(Dot(replica: testReplica(7), counter: 3))  // a delete the restored store never saw
        let lost = report(time: 5_000, lostContext, signature: 2)
        #expect(try store.recordSeen([lost]).fromLostFuture == [lost])
        // Acknowledged once recovered: not news again.
        try store.acknowledgeLostFuture(lost)
        #expect(try store.recordSeen([lost]).fromLostFuture.isEmpty)
    }
}
