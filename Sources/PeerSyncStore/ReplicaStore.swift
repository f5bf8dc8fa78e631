import Foundation
import GRDB
@_spi(Engine) import PeerSyncCRDT
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
///
/// **Without a file.** ``inMemory(name:replicaID:physicalClock:)`` keeps the whole store in
/// memory (SwiftUI previews, app tests), and ``open(database:name:replicaID:filesDirectory:physicalClock:)``
/// runs it over any GRDB `DatabaseWriter` the caller made. Everything above works the same on
/// them, except what needs the file the store opened itself (`directory` is nil then):
/// other processes' commits are not watched (``refresh()`` reports none; a shared database's
/// commits are still joined before each write), the store neither fsyncs (``flushToDisk()``:
/// durability is the writer's own `synchronous` setting) nor checkpoints the WAL, there is no
/// file binding (copy and restore detection), ``bytesOnDisk()`` is 0, and attachments go to a
/// temporary directory (``filesDirectory``) removed when the store is released.
package final class ReplicaStore: Sendable {
    /// The file name inside the store directory.
    public static let fileName = "replica.sqlite"
    /// A delta of more records than this is journaled as "reload" instead of its bytes.
    static let largestJournaledRecords = 256
    /// Journal entries kept (older ones are pruned); a reader further behind reloads.
    public static let journalLength: Int64 = 10_000
    /// A commit whose journal (or conflict) sequence number crosses a multiple of this prunes
    /// that table in its own transaction: one indexed range delete of about this many rows.
    public static let pruneInterval: Int64 = 64

    /// The directory holding the store's file; nil for a store over a database the caller made
    /// (in memory, or ``open(database:name:replicaID:filesDirectory:physicalClock:)``).
    public let directory: String?
    /// The database file (for a store over a caller's database, the database's path, or
    /// "in-memory store"), as errors name it.
    public let path: String
    /// Where files beside the store go (attachments: `filesDirectory/attachments`): `directory`,
    /// or for a store without one the caller's choice or a temporary directory, made when first
    /// written and removed when the store is released.
    public let filesDirectory: String
    /// Whether `filesDirectory` is a temporary one this store removes when it is released.
    private let removesFilesDirectory: Bool
    /// The store's connections: a `DatabasePool` on the store's file, or the caller's writer
    /// (an in-memory `DatabaseQueue`, …).
    let pool: any DatabaseWriter
    /// Checkpoints the WAL (off the commit path when ``checkpointsInBackground``).
    let checkpointer: WALCheckpointer
    /// A connection of its own for `PRAGMA data_version` (other processes' commits); nil for a
    /// store without a file of its own.
    let observer: DatabaseQueue?
    /// Serializes every change of `inner.state` in this process. Lock order: `writer`, then
    /// `inner`, then SQLite's write lock. A large remote commit holds only `writer` while it
    /// works (ReplicaStore+Transactions.swift), so readers of ``state`` never wait for it.
    let writer = Mutex<Void>(())
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
    /// ``close()`` ran: writes throw ``StoreError/closed(path:)``. Apart from `inner`: writes
    /// check it while they hold `inner`.
    private let closed = Atomic<Bool>(false)

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
        let (pool, checkpointer) = try openPool(path)
        do {
            try initialize(pool, name: name, replicaID: replicaID, binding: Self.binding(of: path))
            try Self.flush(path)
        } catch {
            try? FileManager.default.removeItem(atPath: path)
            throw StoreError.wrap(error, path: path)
        }
        return try ReplicaStore(directory: directory, path: path, pool: pool, checkpointer: checkpointer,
                                physicalClock: physicalClock)
    }

    /// Makes the tables of a new store in an empty database, and its replica row.
    static func initialize(_ writer: any DatabaseWriter, name: String, replicaID: ReplicaID, binding: String?) throws {
        // Before the first table: deleted space can then go back to the file system
        // (compaction; existing stores switch with a one-time VACUUM).
        try writer.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA auto_vacuum = INCREMENTAL") }
        try Schema.migrator.migrate(writer)
        try writer.write { db in
            try ReplicaRow(
                replicaID: replicaID.description, name: name,
                createdAt: Int64(clamping: HybridLogicalClock.wallClock()), clock: 0,
                context: Data(CausalContext().encodedBlob()), binding: binding
            ).insert(db)
            try db.execute(sql: "INSERT INTO incarnation (replicaID, startedAt, reason) VALUES (?, ?, ?)",
                           arguments: [replicaID.description, Int64(HybridLogicalClock.wallClock()), "created"])
        }
    }

    /// Opens the replica in `directory`.
    public static func open(
        directory: String,
        physicalClock: @escaping HybridLogicalClock.PhysicalClock = HybridLogicalClock.wallClock
    ) throws(StoreError) -> ReplicaStore {
        let path = Self.path(in: directory)
        guard FileManager.default.fileExists(atPath: path) else { throw .missing(directory: directory) }
        let (pool, checkpointer) = try openPool(path)
        do {
            guard try upgrade(pool, path: path) else {
                throw StoreError.notAStore(path: path, detail: "an SQLite database without PeerSync tables")
            }
        } catch {
            throw StoreError.wrap(error, path: path)
        }
        let store = try ReplicaStore(directory: directory, path: path, pool: pool, checkpointer: checkpointer,
                                     physicalClock: physicalClock)
        try store.checkBinding()
        return store
    }

    /// Migrates the store in `writer` to this version's schema; false if the database holds no
    /// PeerSync store. Throws ``StoreError/newerFormat(path:unknownMigrations:)`` for a store a
    /// newer version wrote.
    static func upgrade(_ writer: any DatabaseWriter, path: String) throws -> Bool {
        let (isOurs, unknown) = try writer.read { db in
            (try db.tableExists(ReplicaRow.databaseTableName),
             try Schema.migrator.appliedIdentifiers(db).subtracting(Schema.migrator.migrations))
        }
        guard isOurs else { return false }
        guard unknown.isEmpty else { throw StoreError.newerFormat(path: path, unknownMigrations: unknown.sorted()) }
        try Schema.migrator.migrate(writer)
        return true
    }

    /// The database file of the replica in `directory`.
    public static func path(in directory: String) -> String {
        (directory as NSString).appendingPathComponent(fileName)
    }

    /// The store's connections, with the checkpointer their WAL hook reports to.
    private static func openPool(_ path: String) throws(StoreError) -> (DatabasePool, WALCheckpointer) {
        let checkpointer = WALCheckpointer(path: path)
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
            return (try DatabasePool(path: path, configuration: config), checkpointer)
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }

    /// `directory` nil: a store over a caller's database (no observer; `filesDirectory` given).
    init(directory: String?, path: String, pool: any DatabaseWriter, checkpointer: WALCheckpointer,
                 filesDirectory: String? = nil, removesFilesDirectory: Bool = false,
                 physicalClock: @escaping HybridLogicalClock.PhysicalClock) throws(StoreError) {
        self.directory = directory
        self.path = path
        self.pool = pool
        self.checkpointer = checkpointer
        self.filesDirectory = directory ?? filesDirectory!
        self.removesFilesDirectory = removesFilesDirectory
        self.physicalClock = physicalClock
        do {
            observer = try directory.map { _ in try DatabaseQueue(path: path) }
            let (state, position, compaction) = try pool.read { db in
                (try Self.loadState(db, physicalClock: physicalClock),
                 try Int64.fetchOne(db, sql: "SELECT max(seq) FROM journal") ?? 0,
                 try Self.loadCompaction(db))
            }
            let version = try observer?.inDatabase { try Int.fetchOne($0, sql: "PRAGMA data_version") }
            inner = Mutex(Inner(state: state, position: position, dataVersion: version, compaction: compaction))
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }

    deinit {
        if removesFilesDirectory { try? FileManager.default.removeItem(atPath: filesDirectory) }
    }

    /// Closes the store's database connections after the background checkpoint in progress, if
    /// any: the files are released (another `ReplicaStore` may open them, the app may move or
    /// delete them). The state in memory stays readable; every write afterwards throws
    /// ``StoreError/closed(path:)``. Calling it again does nothing.
    public func close() throws(StoreError) {
        guard closed.compareExchange(expected: false, desired: true, ordering: .sequentiallyConsistent).exchanged else { return }
        checkpointer.waitForBackgroundPass()
        do {
            try pool.close()
            try observer?.close()
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }

    /// Whether ``close()`` ran.
    public var isClosed: Bool { closed.load(ordering: .sequentiallyConsistent) }

    // MARK: - Reading

    /// A snapshot of the replica's state as this process last saw it (see ``refresh()``): the
    /// state after the last committed change. A small change in progress makes it wait (briefly);
    /// a large one from a peer does not, and shows only once it has committed.
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

    /// Size of the database file and its WAL, in bytes (0 for a store without a file of its own).
    public func bytesOnDisk() -> Int {
        guard directory != nil else { return 0 }
        return [path, path + "-wal"].reduce(0) { total, file in
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
        try transaction(origin: "local", localEvents: { $0?.context }) { state in
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
    public func applyRemote(_ deltas: [RecordMap], from origin: String, origins: [ChangeOrigin]? = nil) throws(StoreError) -> MergeOutcome {
        var outcome = MergeOutcome()
        for each in try applyRemoteEach(deltas, from: origin, origins: origins) { outcome.absorb(each) }
        return outcome
    }

    /// Joins several deltas in one transaction (all or none) and reports what each one changed,
    /// in order (a group commit of deltas from several peers).
    ///
    /// `origins`: where each delta came from, in order, for the commit feed (nil: all
    /// ``ChangeOrigin/local``). `bySync`: sync itself received them (it passes them on; the
    /// feed does not offer them to ship), else they are an import the replicator ships.
    public func applyRemoteEach(_ deltas: [RecordMap], from origin: String, origins: [ChangeOrigin]? = nil,
                                bySync: Bool = false) throws(StoreError) -> [MergeOutcome] {
        do {
            // Refuse what breaks the limits before the transaction: a refusal then costs
            // O(delta + context), not a rollback and a reload of the state. (The transaction
            // checks again, against whatever other processes committed meanwhile.)
            try Self.checkLimits(deltas, joinedInto: inner.withLock { $0.state.context })
            // Rows only for records the join changed: a record a second peer sent again (a
            // healing partition's overlapping rounds) is not encoded and written twice.
            let rows: ([MergeOutcome]) -> Set<RecordKey>? = { outcomes in
                outcomes.count == 1 ? outcomes[0].changedStates
                    : outcomes.reduce(into: Set()) { $0.formUnion($1.changedStates) }
            }
            let records = deltas.reduce(0) { $0 + $1.recordCount }
            return try transaction(origin: origin, changeOrigins: origins, bySync: bySync, deltasChecked: true, records: records, rows: rows) { state in
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
        writer.withLock { _ in inner.withLock { $0.state.name = name } }
    }

    // MARK: - Durability and transactions (ReplicaStore+Transactions.swift)

    /// Called just before a write flushes the WAL (tests: hold a write there and read meanwhile).
    let beforeFlush = Mutex<(@Sendable () -> Void)?>(nil)
    /// Called inside every transaction, after its rows are written and before it commits
    /// (tests: hold a large change there, then read and write meanwhile).
    let insideTransaction = Mutex<(@Sendable () -> Void)?>(nil)
}
