import Foundation
import GRDB
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import Synchronization

/// Durability (fsync of the WAL, background checkpoints) and the shape of every transaction.
extension ReplicaStore {
    // MARK: - Durability

    /// Whether WAL checkpoints run off the commit path: a background pass copies the WAL into
    /// the database file while commits go on (a commit then never waits for ~4 MiB to be
    /// copied and fsynced). Off by default, where each commit that finds the WAL past 1,000
    /// pages checkpoints inline as SQLite does — right for a process that commits and exits,
    /// whose pass would be cut short by its exit. A process that keeps the store open and
    /// commits often turns it on (`StoreSyncStorage` does, for every sync node). No effect on a
    /// store without a file of its own (its writer's configuration checkpoints).
    public var checkpointsInBackground: Bool {
        get { checkpointer.background.load(ordering: .relaxed) }
        set { checkpointer.background.store(newValue, ordering: .relaxed) }
    }

    /// Makes every committed write durable: fsyncs the WAL (SQLite runs with synchronous=NORMAL,
    /// which writes the WAL at commit without syncing it). Never called with the state lock held.
    /// A store over a caller's database has no file of its own to sync: its writer's
    /// configuration decides durability.
    func flushToDisk() throws(StoreError) {
        if let hook = beforeFlush.withLock({ $0 }) { hook() }
        guard directory != nil else { return }
        try Self.flush(path)
    }

    static func flush(_ path: String) throws(StoreError) {
        // The WAL holds every commit since the last checkpoint; a checkpoint syncs the database
        // file itself before it resets the WAL. Without a WAL file, the database file is the data.
        var failure = syncFile(path + "-wal")
        if failure == ENOENT { failure = syncFile(path) }
        if failure != 0 {
            throw .io(path: path, detail: "written but not flushed to disk: \(String(cString: strerror(failure)))")
        }
    }

    // MARK: - Transactions

    /// A write transaction (BEGIN IMMEDIATE). Storage errors come out as ``StoreError``; errors
    /// `body` throws itself come out unchanged.
    func run<T>(_ body: (Database) throws -> T) throws -> T {
        if isClosed { throw StoreError.closed(path: path) }
        do {
            return try pool.writeWithoutTransaction { db in
                var result: T?
                try db.inTransaction(.immediate) {
                    result = try body(db)
                    return .commit
                }
                return result!
            }
        } catch {
            throw StoreError.wrapIfStorage(error, path: path)
        }
    }

    func read<T>(_ body: (Database) throws -> T) throws(StoreError) -> T {
        do {
            return try pool.read(body)
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }

    /// The shape of every state change: catch up, mutate a copy, persist what the delta touched,
    /// commit, and only then publish the new state.
    /// `deltasChecked`: the caller already checked each delta's own limits (only the joined
    /// context is checked again, against whatever other processes committed meanwhile).
    /// `records`: how many records the change joins, when known beforehand (remote deltas);
    /// a large change then runs beside readers (``largeChange(_:heldRecords:)``).
    /// `rows`: given the body's result, the records whose rows to write (nil: every record of
    /// the deltas). `localEvents`: given the body's result, the dots of the change's own (local)
    /// events, journaled beside it (`journal.events`, migration v6); nil for none. `also`: more
    /// SQL of the same transaction, after the rows are written.
    func transaction<T: Sendable>(
        origin: String, changeOrigins: [ChangeOrigin]? = nil, bySync: Bool = false, deltasChecked: Bool = false, records: Int? = nil, rows: (T) -> Set<RecordKey>? = { _ in nil },
        localEvents: (T) -> CausalContext? = { _ in nil }, also: (Database, T) throws -> Void = { _, _ in },
        _ body: (inout ReplicaState) throws -> (T, [RecordMap])
    ) throws -> T {
        let result = try writer.withLock { _ in
            let change = { (state: inout ReplicaState, position: inout Int64, absorbed: inout [StoreChange]) in
                try self.commit(origin: origin, changeOrigins: changeOrigins, bySync: bySync, deltasChecked: deltasChecked, rows: rows, localEvents: localEvents, also: also, body,
                                on: &state, position: &position, absorbed: &absorbed)
            }
            if let records, Self.largeChange(records, heldRecords: inner.withLock { $0.state.records.recordCount }) {
                return try committingBesideReaders(change)
            }
            return try committingInPlace(change)
        }
        try flushToDisk()  // outside the locks: readers see the committed state meanwhile
        return result
    }

    /// Runs `body` with the state locked for a change outside ``transaction``: `writer`
    /// first (the lock order), so no large change is working on its own copy meanwhile.
    func changingState<R: Sendable, E: Error>(_ body: (inout Inner) throws(E) -> R) throws(E) -> R {
        try writer.withLock { _ throws(E) -> R in
            try inner.withLock { inner throws(E) -> R in try body(&inner) }
        }
    }

    /// Whether a change joining `records` records into a state of `heldRecords` works on its
    /// own copy while readers go on with the state before it: at least 64 records and 1/16 of
    /// those held. The copy costs O(records held), a small part of writing ≥ 1/16 of them;
    /// a smaller change holds the state lock throughout (it is short) and changes the state in
    /// place.
    static func largeChange(_ records: Int, heldRecords: Int) -> Bool {
        records >= 64 && records * 16 >= heldRecords
    }

    /// One change: what ``commit(origin:deltasChecked:rows:_:on:position:absorbed:)`` does with
    /// the caller's arguments bound.
    private typealias Change<T> = (inout ReplicaState, inout Int64, inout [StoreChange]) throws -> Committed<T>

    /// What a committed change publishes (other processes' commits it joined are beside it,
    /// in the caller's `absorbed`).
    private struct Committed<T> {
        var result: T
        var deltas: [RecordMap]
        /// Where each delta came from (nil: all local).
        var origins: [ChangeOrigin]?
        /// Sync committed the deltas (from peers): the commit feed does not offer them to ship.
        var bySync: Bool
    }

    /// Runs `body` in one SQLite transaction on `state`: joins other processes' commits,
    /// applies it, checks limits, persists. On a throw, `state` may hold part of it.
    private func commit<T>(
        origin: String, changeOrigins: [ChangeOrigin]?, bySync: Bool, deltasChecked: Bool, rows: (T) -> Set<RecordKey>?, localEvents: (T) -> CausalContext?,
        also: (Database, T) throws -> Void, _ body: (inout ReplicaState) throws -> (T, [RecordMap]),
        on state: inout ReplicaState, position: inout Int64, absorbed: inout [StoreChange]
    ) throws -> Committed<T> {
        try run { db in
            absorbed = try catchUp(db, &state, &position)
            let conflictsBefore = state.conflicts.totalRecorded
            let localBefore = state.localSettings
            let (result, deltas) = try body(&state)
            try state.throwIfLocalChangeFailed()
            try Self.checkLimits(deltasChecked ? [] : deltas, joinedInto: state, changed: !deltas.isEmpty)
            let newConflicts = state.conflicts.entries.suffix(min(state.conflicts.totalRecorded - conflictsBefore,
                                                                  state.conflicts.entries.count))
            try persist(db, state: state, deltas: deltas, rows: rows(result), localBefore: localBefore,
                        conflicts: Array(newConflicts), origin: origin, localEvents: localEvents(result), position: &position)
            try also(db, result)
            if let hook = insideTransaction.withLock({ $0 }) { hook() }
            return Committed(result: result, deltas: deltas, origins: changeOrigins, bySync: bySync)
        }
    }

    /// Publishes a committed change (with `inner` locked).
    private func publish<T>(_ committed: Committed<T>, state: ReplicaState, position: Int64, absorbed: [StoreChange],
                            into inner: inout Inner) -> T {
        inner.state = state
        commits.publish(state: state, absorbed: absorbed, deltas: committed.deltas, origins: committed.origins,
                       shipDeltas: !committed.bySync)
        inner.position = position
        inner.absorbed += absorbed
        return committed.result
    }

    /// A change with the state lock held throughout, on the state itself.
    private func committingInPlace<T: Sendable>(_ change: Change<T>) throws -> T {
        try inner.withLock { inner in
            // Take the state out so it is uniquely referenced: mutating it then costs nothing
            // extra, where a copy would duplicate every record on each transaction.
            var state = inner.state
            inner.state = ReplicaState(replicaID: state.replicaID, name: state.name)
            var position = inner.position
            var absorbed: [StoreChange] = []
            do {
                let committed = try change(&state, &position, &absorbed)
                return publish(committed, state: state, position: position, absorbed: absorbed, into: &inner)
            } catch {
                // The transaction rolled back; the taken state may hold part of the change.
                // Reload what is on disk (failures are rare: disk full, read-only, a throwing body).
                // The position stays where it was, so the next refresh() still reports (and the
                // node still ships) other processes' commits joined into this reloaded state.
                inner.state = (try? pool.read { db in try Self.loadState(db, physicalClock: physicalClock) }) ?? state
                if !absorbed.isEmpty { commits.publish(state: inner.state, absorbed: absorbed, deltas: []) }
                throw error
            }
        }
    }

    /// A large change on a copy of the state, without the state lock: readers go on with the
    /// state before it until it has committed. Takes the state before SQLite's write lock
    /// (the lock order); `writer` keeps every other change of it out meanwhile. If it fails,
    /// the published state is untouched and nothing needs reloading.
    private func committingBesideReaders<T: Sendable>(_ change: Change<T>) throws -> T {
        var (state, position) = inner.withLock { ($0.state, $0.position) }
        var absorbed: [StoreChange] = []
        let committed = try change(&state, &position, &absorbed)
        // The state before the change leaves the lock and is freed outside it (unless a reader
        // still holds it): freeing the records the change replaced takes milliseconds.
        let (result, _) = inner.withLock { inner in
            let before = inner.state
            return (publish(committed, state: state, position: position, absorbed: absorbed, into: &inner), before)
        }
        return result
    }
}
