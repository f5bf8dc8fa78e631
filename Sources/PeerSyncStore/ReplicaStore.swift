import Foundation
import GRDB
import PeerSyncCRDT
import PeerSyncModel
import Synchronization

/// One replica on disk: an SQLite file (WAL) in a directory, and the replica's state in memory.
///
/// - Every change is one transaction: a local edit is reported done only after its delta, the
///   context and the clock commit together; a remote delta applies whole or not at all. If the
///   transaction fails (disk full, read-only, …) the in-memory state is left as it was.
/// - Several processes may share one store (the CLI beside a running node). Each commit also
///   appends its delta to a journal; before every write, and on ``refresh()``, a process joins the
///   journal entries it has not seen — only the new changes, never the whole store. A process
///   notices another's commit through `PRAGMA data_version` on a dedicated connection.
/// - The journal keeps the last ``journalLength`` entries and the conflict table the last
///   ``ConflictLog/defaultCapacity``: whichever process commits (a node, or a one-commit CLI
///   command) prunes inside its own transaction when a sequence number crosses a multiple of
///   ``pruneInterval``, so neither table ever holds more than its limit + ``pruneInterval`` rows.
/// - Every change is checked against ``ValidationLimits`` before it is written (a remote delta,
///   or a local one holding a value nested too deep): the store never holds what it could not
///   read back or what its peers would refuse.
///
/// All methods are thread-safe; writes of one process are serialized.
public final class ReplicaStore: Sendable {
    /// The file name inside the store directory.
    public static let fileName = "replica.sqlite"
    /// A delta of more records than this is journaled as "reload" instead of its bytes.
    static let largestJournaledRecords = 256
    /// Journal entries kept (older ones are pruned); a reader further behind reloads.
    public static let journalLength: Int64 = 10_000
    /// A commit whose journal (or conflict) sequence number crosses a multiple of this prunes
    /// that table in its own transaction: one indexed range delete of about this many rows.
    public static let pruneInterval: Int64 = 64

    public let directory: String
    public let path: String
    let pool: DatabasePool
    /// Checkpoints the WAL (off the commit path when ``checkpointsInBackground``).
    let checkpointer: WALCheckpointer
    private let observer: DatabaseQueue
    let inner: Mutex<Inner>
    let physicalClock: HybridLogicalClock.PhysicalClock
    /// Every state change, in commit order, for live queries and other observers.
    public let commits = CommitFeed()

    struct Inner: Sendable {
        var state: ReplicaState
        /// Highest journal sequence number this process has joined.
        var position: Int64
        var dataVersion: Int?
        /// Other processes' commits joined inside this process's own transactions; the next
        /// ``refresh()`` reports them, so they are shipped to peers like any other.
        var absorbed: [StoreChange] = []
        /// Set when opening found the store copied or restored and gave it a new replica ID.
        var incarnationChange: IncarnationChange?
        /// Compaction gossip and frontier (ReplicaStore+Compaction.swift).
        var compaction = CompactionRecord()
    }

    // MARK: - Opening

    /// Creates a new replica in `directory` (made if missing). Fails if one is already there.
    public static func create(
        directory: String, name: String, replicaID: ReplicaID = .random(),
        physicalClock: @escaping HybridLogicalClock.PhysicalClock = HybridLogicalClock.wallClock
    ) throws(StoreError) -> ReplicaStore {
        let path = Self.path(in: directory)
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        } catch {
            throw .cannotOpen(path: directory, detail: "cannot create the directory: \(error.localizedDescription)")
        }
        if FileManager.default.fileExists(atPath: path) {
            if let existing = try? open(directory: directory) {
                throw .alreadyExists(directory: directory, replicaID: existing.replicaID.description)
            }
            throw .notAStore(path: path, detail: "a file is already there")
        }
        let checkpointer = WALCheckpointer(path: path)
        let pool = try openPool(path, checkpointer: checkpointer)
        do {
            // Before the first table: deleted space can then go back to the file system
            // (compaction; existing stores switch with a one-time VACUUM).
            try pool.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA auto_vacuum = INCREMENTAL") }
            try Schema.migrator.migrate(pool)
            try pool.write { db in
                try ReplicaRow(
                    replicaID: replicaID.description, name: name,
                    createdAt: Int64(clamping: HybridLogicalClock.wallClock()), clock: 0,
                    context: Data(CausalContext().encodedBlob()), binding: Self.binding(of: path)
                ).insert(db)
                try db.execute(sql: "INSERT INTO incarnation (replicaID, startedAt, reason) VALUES (?, ?, ?)",
                               arguments: [replicaID.description, Int64(HybridLogicalClock.wallClock()), "created"])
            }
            try Self.flush(path)
        } catch {
            try? FileManager.default.removeItem(atPath: path)
            throw StoreError.wrap(error, path: path)
        }
        return try ReplicaStore(directory: directory, path: path, pool: pool, checkpointer: checkpointer,
                                physicalClock: physicalClock)
    }

    /// Opens the replica in `directory`.
    public static func open(
        directory: String,
        physicalClock: @escaping HybridLogicalClock.PhysicalClock = HybridLogicalClock.wallClock
    ) throws(StoreError) -> ReplicaStore {
        let path = Self.path(in: directory)
        guard FileManager.default.fileExists(atPath: path) else { throw .missing(directory: directory) }
        let checkpointer = WALCheckpointer(path: path)
        let pool = try openPool(path, checkpointer: checkpointer)
        do {
            let (isOurs, unknown) = try pool.read { db in
                (try db.tableExists(ReplicaRow.databaseTableName),
                 try Schema.migrator.appliedIdentifiers(db).subtracting(Schema.migrator.migrations))
            }
            guard isOurs else {
                throw StoreError.notAStore(path: path, detail: "an SQLite database without PeerSync tables")
            }
            guard unknown.isEmpty else { throw StoreError.newerFormat(path: path, unknownMigrations: unknown.sorted()) }
            try Schema.migrator.migrate(pool)
        } catch {
            throw StoreError.wrap(error, path: path)
        }
        let store = try ReplicaStore(directory: directory, path: path, pool: pool, checkpointer: checkpointer,
                                     physicalClock: physicalClock)
        try store.checkBinding()
        return store
    }

    /// The database file of the replica in `directory`.
    public static func path(in directory: String) -> String {
        (directory as NSString).appendingPathComponent(fileName)
    }

    private static func openPool(_ path: String, checkpointer: WALCheckpointer) throws(StoreError) -> DatabasePool {
        var config = Configuration()
        config.busyMode = .timeout(10)
        config.label = "PeerSync store"
        // WAL with synchronous=NORMAL: SQLite writes the WAL at commit but does not fsync it;
        // every write then fsyncs the WAL itself (``flushToDisk()``) after releasing the state
        // lock and before it returns. So an edit reported done survives kill -9 and power loss
        // alike, and readers of `state` never wait for an fsync. Checkpoints run off the commit
        // path (``WALCheckpointer``: its hook replaces SQLite's auto-checkpoint).
        config.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
            try db.execute(sql: "PRAGMA cache_size = -32768")  // 32 MiB of page cache per connection
            checkpointer.install(on: db)
        }
        do {
            return try DatabasePool(path: path, configuration: config)
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }

    private init(directory: String, path: String, pool: DatabasePool, checkpointer: WALCheckpointer,
                 physicalClock: @escaping HybridLogicalClock.PhysicalClock) throws(StoreError) {
        self.directory = directory
        self.path = path
        self.pool = pool
        self.checkpointer = checkpointer
        self.physicalClock = physicalClock
        do {
            observer = try DatabaseQueue(path: path)
            let (state, position, compaction) = try pool.read { db in
                (try Self.loadState(db, physicalClock: physicalClock),
                 try Int64.fetchOne(db, sql: "SELECT max(seq) FROM journal") ?? 0,
                 try Self.loadCompaction(db))
            }
            let version = try observer.inDatabase { try Int.fetchOne($0, sql: "PRAGMA data_version") }
            inner = Mutex(Inner(state: state, position: position, dataVersion: version, compaction: compaction))
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }

    // MARK: - Reading

    /// A snapshot of the replica's state as this process last saw it (see ``refresh()``).
    public var state: ReplicaState { inner.withLock { $0.state } }

    public var replicaID: ReplicaID { state.replicaID }

    /// The newest conflicts, oldest first, as stored (all processes' detections).
    public func conflicts(limit: Int = ConflictLog.defaultCapacity) throws(StoreError) -> [ConflictEntry] {
        try read { db in
            try ConflictRow.order(ConflictRow.Columns.seq.desc).limit(limit).fetchAll(db).reversed().map { try $0.entry() }
        }
    }

    /// The newest journal entries, oldest first.
    public func journal(limit: Int = 100) throws(StoreError) -> [JournalEntry] {
        try read { db in
            try JournalRow.order(JournalRow.Columns.seq.desc).limit(limit).fetchAll(db).reversed().map { row in
                JournalEntry(
                    sequence: row.seq ?? 0, committedAt: row.committedAt, origin: row.origin, summary: row.summary,
                    delta: try row.delta.map { try RecordMap(decoding: Array($0)) })
            }
        }
    }

    /// Counts of visible records per collection, computed in SQL.
    public func visibleCounts() throws(StoreError) -> [String: Int] {
        try read { db in
            var counts: [String: Int] = [:]
            for row in try Row.fetchAll(db, sql: "SELECT collection, count(*) FROM record WHERE visible GROUP BY collection") {
                counts[row[0]] = row[1]
            }
            return counts
        }
    }

    /// Size of the database file and its WAL, in bytes.
    public func bytesOnDisk() -> Int {
        [path, path + "-wal"].reduce(0) { total, file in
            total + ((try? FileManager.default.attributesOfItem(atPath: file)[.size] as? Int) ?? 0)
        }
    }

    // MARK: - Writing

    /// Runs a local change as one transaction. `body` mutates the state and returns the delta
    /// of what it did (join several with `merge`); the delta, the context, the clock, any new
    /// local settings and conflicts commit together. Returns the committed delta.
    ///
    /// Before `body` runs, changes other processes committed are joined, so `body` sees the
    /// latest state and takes a fresh dot. If `body` throws, nothing is written.
    ///
    /// - Throws: what `body` throws; ``CounterExhaustedError`` if a local change in `body`
    ///   could not be made (see ``ReplicaState/localChangeFailure``); ``StoreError/refused(path:detail:)``
    ///   if the change breaks a bound of ``ValidationLimits``; other ``StoreError``s. Nothing is
    ///   written in every case.
    @discardableResult
    public func write(_ body: (inout ReplicaState) throws -> RecordMap?) throws -> RecordMap? {
        try transaction(origin: "local") { state in
            let delta = try body(&state)
            return (delta, delta.map { [$0] } ?? [])
        }
    }

    /// Joins a delta received from a peer in one transaction and returns what changed.
    /// A delta that changes nothing writes nothing. A delta that breaks a bound of
    /// ``ValidationLimits``, or whose join would take the replica's context past one, is
    /// refused (``StoreError/refused(path:detail:)``) and nothing is written.
    @discardableResult
    public func applyRemote(_ delta: RecordMap, from origin: String) throws(StoreError) -> MergeOutcome {
        try applyRemote([delta], from: origin)
    }

    /// Joins several deltas (consecutive catch-up chunks) in one transaction: all or none.
    @discardableResult
    public func applyRemote(_ deltas: [RecordMap], from origin: String) throws(StoreError) -> MergeOutcome {
        var outcome = MergeOutcome()
        for each in try applyRemoteEach(deltas, from: origin) { outcome.absorb(each) }
        return outcome
    }

    /// Joins several deltas in one transaction (all or none) and reports what each one changed,
    /// in order (a group commit of deltas from several peers).
    public func applyRemoteEach(_ deltas: [RecordMap], from origin: String) throws(StoreError) -> [MergeOutcome] {
        do {
            // Refuse what breaks the limits before the transaction: a refusal then costs
            // O(delta + context), not a rollback and a reload of the state. (The transaction
            // checks again, against whatever other processes committed meanwhile.)
            try Self.checkLimits(deltas, joinedInto: inner.withLock { $0.state.context })
            return try transaction(origin: origin, deltasChecked: true) { state in
                let before = state.context
                let outcomes = deltas.map { state.apply($0) }
                let changed = outcomes.contains { !$0.isEmpty } || state.context != before
                return (outcomes, changed ? deltas : [])
            }
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }

    /// Renames the replica (local only).
    public func rename(_ name: String) throws(StoreError) {
        do {
            try run { db in try db.execute(sql: "UPDATE replica SET name = ?", arguments: [name]) }
            try flushToDisk()
        } catch {
            throw StoreError.wrap(error, path: path)
        }
        inner.withLock { $0.state.name = name }
    }

    /// Joins what other processes committed since this one last looked. Cheap when nothing
    /// changed (one `PRAGMA data_version`). Returns the changes, in commit order.
    public func refresh() throws(StoreError) -> [StoreChange] {
        do {
            let version = try observer.inDatabase { try Int.fetchOne($0, sql: "PRAGMA data_version") }
            return try inner.withLock { inner in
                var changes = inner.absorbed
                inner.absorbed = []
                if version != inner.dataVersion {
                    inner.dataVersion = version
                    let joined = try pool.read { db in try self.catchUp(db, &inner.state, &inner.position) }
                    if !joined.isEmpty { commits.publish(state: inner.state, absorbed: joined, deltas: []) }
                    changes += joined
                }
                return changes
            }
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }

    /// Polls ``refresh()`` every `interval` and yields each change other processes commit.
    /// The stream ends with an error if the store fails; cancel the consuming task to stop.
    public func externalChanges(every interval: Duration = .milliseconds(5)) -> AsyncThrowingStream<StoreChange, any Error> {
        AsyncThrowingStream { continuation in
            let task = Task {
                do {
                    while !Task.isCancelled {
                        for change in try self.refresh() { continuation.yield(change) }
                        try await Task.sleep(for: interval)
                    }
                    continuation.finish()
                } catch is CancellationError {
                    continuation.finish()
                } catch {
                    continuation.finish(throwing: error)
                }
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }

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

    /// Called just before a write flushes the WAL (tests: hold a write there and read meanwhile).
    let beforeFlush = Mutex<(@Sendable () -> Void)?>(nil)

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

    private func read<T>(_ body: (Database) throws -> T) throws(StoreError) -> T {
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
    private func transaction<T: Sendable>(
        origin: String, deltasChecked: Bool = false, _ body: (inout ReplicaState) throws -> (T, [RecordMap])
    ) throws -> T {
        let result = try committing(origin: origin, deltasChecked: deltasChecked, body)
        try flushToDisk()  // outside the lock: readers see the committed state meanwhile
        return result
    }

    private func committing<T: Sendable>(
        origin: String, deltasChecked: Bool, _ body: (inout ReplicaState) throws -> (T, [RecordMap])
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
                    try persist(db, state: state, deltas: deltas, localBefore: localBefore,
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
