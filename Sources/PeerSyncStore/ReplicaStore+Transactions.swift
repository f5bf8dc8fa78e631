import Foundation
import GRDB
import PeerSyncCRDT
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
    /// commits often turns it on (`StoreSyncStorage` does, for every sync node).
    public var checkpointsInBackground: Bool {
        get { checkpointer.background.load(ordering: .relaxed) }
        set { checkpointer.background.store(newValue, ordering: .relaxed) }
    }

    /// Makes every committed write durable: fsyncs the WAL (SQLite runs with synchronous=NORMAL,
    /// which writes the WAL at commit without syncing it). Never called with the state lock held.
    func flushToDisk() throws(StoreError) {
        if let hook = beforeFlush.withLock({ $0 }) { hook() }
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
    /// `rows`: given the body's result, the records whose rows to write (nil: every record of
    /// the deltas).
    func transaction<T: Sendable>(
        origin: String, deltasChecked: Bool = false, rows: (T) -> Set<RecordKey>? = { _ in nil },
        _ body: (inout ReplicaState) throws -> (T, [RecordMap])
    ) throws -> T {
        let result = try committing(origin: origin, deltasChecked: deltasChecked, rows: rows, body)
        try flushToDisk()  // outside the lock: readers see the committed state meanwhile
        return result
    }

    private func committing<T: Sendable>(
        origin: String, deltasChecked: Bool, rows: (T) -> Set<RecordKey>?, _ body: (inout ReplicaState) throws -> (T, [RecordMap])
    ) throws -> T {
        try inner.withLock { inner in
            // Take the state out so it is uniquely referenced: mutating it then costs nothing
            // extra, where a copy would duplicate every record on each transaction.
            var state = inner.state
            inner.state = ReplicaState(replicaID: state.replicaID, name: state.name)
            var position = inner.position
            var absorbed: [StoreChange] = []
            var committed: [RecordMap] = []
            let result: T
            do {
                result = try run { db in
                    absorbed = try catchUp(db, &state, &position)
                    let conflictsBefore = state.conflicts.totalRecorded
                    let localBefore = state.localSettings
                    let (result, deltas) = try body(&state)
                    try state.throwIfLocalChangeFailed()
                    try Self.checkLimits(deltasChecked ? [] : deltas, joinedInto: state, changed: !deltas.isEmpty)
                    committed = deltas
                    let newConflicts = state.conflicts.entries.suffix(min(state.conflicts.totalRecorded - conflictsBefore,
                                                                          state.conflicts.entries.count))
                    try persist(db, state: state, deltas: deltas, rows: rows(result), localBefore: localBefore,
                                conflicts: Array(newConflicts), origin: origin, position: &position)
                    return result
                }
            } catch {
                // The transaction rolled back; the taken state may hold part of the change.
                // Reload what is on disk (failures are rare: disk full, read-only, a throwing body).
                // The position stays where it was, so the next refresh() still reports (and the
                // node still ships) other processes' commits joined into this reloaded state.
                inner.state = (try? pool.read { db in try Self.loadState(db, physicalClock: physicalClock) }) ?? state
                if !absorbed.isEmpty { commits.publish(state: inner.state, absorbed: absorbed, deltas: []) }
                throw error
            }
            inner.state = state
            commits.publish(state: state, absorbed: absorbed, deltas: committed)
            inner.position = position
            inner.absorbed += absorbed
            return result
        }
    }
}
