import Foundation
import GRDB
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import PeerSyncStore
import PeerSyncTestSupport
import Testing
import ShiftSchedulerModel

/// Real database files: what the store does with values at and past the limits, and retention.
@Suite("Store limits and retention")
struct LimitsStoreTests {
    /// A delta from a peer that carries a dot of `replica` with `counter`.
    func planted(_ replica: ReplicaID, counter: UInt64, key: RecordKey = RecordKey(collection: Location.collection, id: UUID())) -> RecordMap {
        let dot = Dot(replica: replica, counter: counter)
        let state = RecordState(fields: ["name": FieldRegister(value: "planted", timestamp: HLCTimestamp(physicalMilliseconds: 1_000, logical: 0),
                                                               dot: dot, supersedes: .zero)],
                                presence: [replica: PresenceEntry(counter: counter, removedBy: nil)])
        return RecordMap(records: [(key, state)], context: CausalContext(dots: [dot]), maintainingDigest: false)
    }

    func rows(_ table: String, in dir: String) throws -> Int {
        try DatabaseQueue(path: ReplicaStore.path(in: dir)).read { try Int.fetchOne($0, sql: "SELECT count(*) FROM \(table)") ?? 0 }
    }

    @Test("issue 17: a peer's dot of this replica at 2⁵³ makes local writes fail cleanly, before and after a restart")
    func exhaustedCounterOnDisk() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        let store = try ReplicaStore.create(directory: dir, name: "victim")
        try store.write { try $0.save(Location(name: "Before", address: "")) }
        try store.applyRemote(planted(store.replicaID, counter: ValidationLimits.maxCounter), from: "peer:test")
        let digest = store.state.digest
        let journal = try store.journal(limit: 100).count
        for attempt in 0..<2 {
            let current = attempt == 0 ? store : try ReplicaStore.open(directory: dir)
            #expect(throws: CounterExhaustedError(replica: store.replicaID)) {
                try current.write { try $0.save(Location(name: "After", address: "")) }
            }
            #expect(throws: CounterExhaustedError(replica: store.replicaID)) {
                try current.write { $0.setSetting("weekStart", to: 2, scope: .synced) }
            }
            #expect(current.state.digest == digest)
            #expect(try current.journal(limit: 100).count == journal)
        }
        // Remote changes still apply.
        let peer = testReplica(3)
        try store.applyRemote(planted(peer, counter: 1), from: "peer:test")
        #expect(store.state.digest != digest)
    }

    @Test("a delta past the limits is refused whole and nothing is written")
    func overLimitDeltasRefused() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        let store = try ReplicaStore.create(directory: dir, name: "x")
        try store.write { try $0.save(Location(name: "Before", address: "")) }
        let digest = store.state.digest
        func expectRefused(_ delta: RecordMap, _ what: String, sourceLocation: SourceLocation = #_sourceLocation) {
            #expect(sourceLocation: sourceLocation) {
                try store.applyRemote(delta, from: "peer:test")
            } throws: { error in
                guard case StoreError.refused(let path, let detail) = error else { return false }
                return path.hasSuffix("replica.sqlite") && detail.contains(what) && !"\(error)".contains("\n")
            }
            #expect(store.state.digest == digest, sourceLocation: sourceLocation)
        }
        expectRefused(planted(testReplica(5), counter: .max), "counter")
        expectRefused(planted(testReplica(5), counter: ValidationLimits.maxCounter + 1), "counter")
        // Two deltas that are each within the limits but together name 12,000 replicas.
        let first = RecordMap(records: [(RecordKey, RecordState)](), context: CausalContext(versionVector: Dictionary(uniqueKeysWithValues:
            (0..<6_000).map { (ReplicaID(high: 1, low: UInt64($0)), UInt64(1)) })), maintainingDigest: false)
        let second = RecordMap(records: [(RecordKey, RecordState)](), context: CausalContext(versionVector: Dictionary(uniqueKeysWithValues:
            (0..<6_000).map { (ReplicaID(high: 2, low: UInt64($0)), UInt64(1)) })), maintainingDigest: false)
        try store.applyRemote(first, from: "peer:test")
        let wide = store.state.digest
        #expect {
            try store.applyRemote(second, from: "peer:test")
        } throws: { error in
            guard case StoreError.refused(_, let detail) = error else { return false }
            return detail.contains("10000")
        }
        #expect(store.state.digest == wide)
        #expect(try ReplicaStore.open(directory: dir).state.digest == wide)
    }

    @Test("a local value nested deeper than the store can read back is refused")
    func tooDeepLocalValue() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        let store = try ReplicaStore.create(directory: dir, name: "x")
        var deep = FieldValue.null
        for _ in 0..<70 { deep = .list([deep]) }
        let value = deep
        #expect {
            try store.write { $0.upsert(["deep": value], to: RecordKey(collection: "notes", id: UUID())) }
        } throws: { error in
            guard case StoreError.refused(_, let detail) = error else { return false }
            return detail.contains("deeper than 64")
        }
        #expect(try ReplicaStore.open(directory: dir).state.records.recordCount == 0)
    }

    @Test("a stored clock after the year 9999 is reported as corrupt, not trapped on")
    func clockPastTheLimit() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        _ = try ReplicaStore.create(directory: dir, name: "x")
        try DatabaseQueue(path: ReplicaStore.path(in: dir)).write { try $0.execute(sql: "UPDATE replica SET clock = -1") }
        #expect {
            _ = try ReplicaStore.open(directory: dir)
        } throws: { error in
            guard case StoreError.corrupt(_, let detail) = error else { return false }
            return detail.contains("clock")
        }
    }

    /// Commits made by each fresh store instance: 100 by default (under the old per-process
    /// rule, pruning after 256 commits of one process, nothing was ever pruned then), 1 with
    /// PEERSYNC_LONG=1 (Scripts/reliability.sh): 12,000 opens take ~8 minutes in a debug
    /// build, most of it decoding the 1,000-entry conflict log at each open, and would starve
    /// the timing-sensitive session tests running beside it.
    static let commitsPerInstance = ProcessInfo.processInfo.environment["PEERSYNC_LONG"] == nil ? 100 : 1

    @Test("retention holds whichever process commits: 12,000 commits from short-lived store instances")
    func retentionAcrossShortLivedWriters() throws {
        // In memory-backed /dev/shm where there is one: this test is about which rows remain,
        // and 12,000 fsyncs on a shared disk would take minutes.
        let base = FileManager.default.fileExists(atPath: "/dev/shm") ? "/dev/shm" : FileManager.default.temporaryDirectory.path
        let dir = (base as NSString).appendingPathComponent("peersync-retention-\(UUID().uuidString)")
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { removeTemporaryDirectory(dir) }
        let key = RecordKey(collection: ShiftType.collection, id: UUID())
        let replicaID = try ReplicaStore.create(directory: dir, name: "x").replicaID
        try ReplicaStore.open(directory: dir).write { $0.upsert(["title": "local"], to: key) }
        let peer = testReplica(7)
        let start = ContinuousClock.now
        var store = try ReplicaStore.open(directory: dir)
        for i in 0..<12_000 {
            // Commits from fresh store instances (as each `peersync` command is): a peer's
            // write to the same field that never saw the previous one, so every commit also
            // logs one conflict.
            if i % Self.commitsPerInstance == 0 { store = try ReplicaStore.open(directory: dir) }
            let dot = Dot(replica: peer, counter: UInt64(i + 1))
            let register = FieldRegister(value: .int(Int64(i)), timestamp: HLCTimestamp(physicalMilliseconds: 4_000_000_000_000 + UInt64(i), logical: 0),
                                         dot: dot, supersedes: .zero)
            let delta = RecordMap(records: [(key, RecordState(fields: ["title": register], presence: [peer: PresenceEntry(counter: dot.counter, removedBy: nil)]))],
                                  context: CausalContext(dots: [dot]), maintainingDigest: false)
            let outcome = try store.applyRemote(delta, from: "peer:test")
            #expect(outcome.conflicts.count == 1, "commit \(i)")
        }
        let elapsed = ContinuousClock.now - start
        let journal = try rows("journal", in: dir)
        let conflicts = try rows("conflict", in: dir)
        print("retention: 12,000 commits, \(Self.commitsPerInstance) per store instance, in \(elapsed); journal \(journal) rows, conflict \(conflicts) rows")
        #expect(journal <= Int(ReplicaStore.journalLength + ReplicaStore.pruneInterval))
        #expect(journal >= Int(ReplicaStore.journalLength))
        #expect(conflicts <= ConflictLog.defaultCapacity + Int(ReplicaStore.pruneInterval))
        #expect(conflicts >= ConflictLog.defaultCapacity)
        // The newest entries are the ones kept, and a reader far behind still catches up.
        let reopened = try ReplicaStore.open(directory: dir)
        #expect(reopened.replicaID == replicaID)
        #expect(try reopened.journal(limit: 1).first?.sequence == 12_001)
        #expect(reopened.state.records.record(key)?.fields["title"]?.value == .int(11_999))
        #expect(try reopened.conflicts(limit: 1).first?.winner.value == .int(11_999))
    }
}
