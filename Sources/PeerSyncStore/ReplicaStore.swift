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
        let pool = try openPool(path)
        do {
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
        return try ReplicaStore(directory: directory, path: path, pool: pool, physicalClock: physicalClock)
    }

    /// Opens the replica in `directory`.
    public static func open(
        directory: String,
        physicalClock: @escaping HybridLogicalClock.PhysicalClock = HybridLogicalClock.wallClock
    ) throws(StoreError) -> ReplicaStore {
        let path = Self.path(in: directory)
        guard FileManager.default.fileExists(atPath: path) else { throw .missing(directory: directory) }
        let pool = try openPool(path)
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
        let store = try ReplicaStore(directory: directory, path: path, pool: pool, physicalClock: physicalClock)
        try store.checkBinding()
        return store
    }

    /// The database file of the replica in `directory`.
    public static func path(in directory: String) -> String {
        (directory as NSString).appendingPathComponent(fileName)
    }

    private static func openPool(_ path: String) throws(StoreError) -> DatabasePool {
        var config = Configuration()
        config.busyMode = .timeout(10)
        config.label = "PeerSync store"
        // WAL with synchronous=NORMAL: SQLite writes the WAL at commit but does not fsync it;
        // every write then fsyncs the WAL itself (``flushToDisk()``) after releasing the state
        // lock and before it returns. So an edit reported done survives kill -9 and power loss
        // alike, and readers of `state` never wait for an fsync.
        config.prepareDatabase { db in
            try db.execute(sql: "PRAGMA synchronous = NORMAL")
            try db.execute(sql: "PRAGMA cache_size = -32768")  // 32 MiB of page cache per connection
        }
        do {
            return try DatabasePool(path: path, configuration: config)
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }

    private init(directory: String, path: String, pool: DatabasePool,
                 physicalClock: @escaping HybridLogicalClock.PhysicalClock) throws(StoreError) {
        self.directory = directory
        self.path = path
        self.pool = pool
        self.physicalClock = physicalClock
        do {
            observer = try DatabaseQueue(path: path)
            let (state, position) = try pool.read { db in
                (try Self.loadState(db, physicalClock: physicalClock),
                 try Int64.fetchOne(db, sql: "SELECT max(seq) FROM journal") ?? 0)
            }
            let version = try observer.inDatabase { try Int.fetchOne($0, sql: "PRAGMA data_version") }
            inner = Mutex(Inner(state: state, position: position, dataVersion: version))
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
            return try transaction(origin: origin) { state in
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
    private func run<T>(_ body: (Database) throws -> T) throws -> T {
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
    private func transaction<T: Sendable>(
        origin: String, _ body: (inout ReplicaState) throws -> (T, [RecordMap])
    ) throws -> T {
        let result = try committing(origin: origin, body)
        try flushToDisk()  // outside the lock: readers see the committed state meanwhile
        return result
    }

    private func committing<T: Sendable>(
        origin: String, _ body: (inout ReplicaState) throws -> (T, [RecordMap])
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
                    try Self.checkLimits(deltas, joinedInto: state)
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

    /// Replaces the stored state of some records (nil or an empty state removes the record)
    /// without changing the context, so nothing removed can come back as "missing": used to purge
    /// what the roster refuses (a removed device's writes past its cutoff) and deleted records
    /// every device has seen (compaction). `compute` sees the latest state (other processes'
    /// commits joined) and returns the replacements. Other processes reload. Returns how many
    /// records changed.
    @discardableResult
    public func replaceRecords(reason: String, _ compute: (ReplicaState) -> [RecordKey: RecordState?]) throws(StoreError) -> Int {
        do {
            let changed = try inner.withLock { inner in
                var state = inner.state
                var position = inner.position
                var absorbed: [StoreChange] = []
                let count = try run { db -> Int in
                    absorbed = try catchUp(db, &state, &position)
                    let replacements = compute(state)
                    guard !replacements.isEmpty else { return 0 }
                    let upsert = try db.cachedStatement(sql: """
                        INSERT INTO record (collection, id, visible, state) VALUES (?, ?, ?, ?)
                        ON CONFLICT (collection, id) DO UPDATE SET visible = excluded.visible, state = excluded.state
                        """)
                    let delete = try db.cachedStatement(sql: "DELETE FROM record WHERE collection = ? AND id = ?")
                    var records = Dictionary(uniqueKeysWithValues: state.records.allRecords.map { ($0.0, $0.1) })
                    for (key, replacement) in replacements {
                        if let replacement, !(replacement.fields.isEmpty && replacement.presence.isEmpty) {
                            try upsert.execute(arguments: [key.collection, key.id.data, replacement.isVisible, Data(replacement.encodedBlob())])
                            records[key] = replacement
                        } else {
                            try delete.execute(arguments: [key.collection, key.id.data])
                            records[key] = nil
                        }
                    }
                    var marker = JournalRow(committedAt: Int64(physicalClock()), origin: "purge",
                                            summary: "\(reason): \(replacements.count) records", delta: nil)
                    try marker.insert(db)
                    position = marker.seq ?? position
                    state = ReplicaState(
                        replicaID: state.replicaID, name: state.name, records: RecordMap(records: records.map { ($0.key, $0.value) }, context: state.context),
                        localSettings: state.localSettings, conflicts: state.conflicts, clockFloor: state.clock.latest,
                        physicalClock: physicalClock)
                    return replacements.count
                }
                inner.state = state
                inner.position = position
                inner.absorbed += absorbed
                commits.publish(state: state, absorbed: absorbed + [StoreChange(sequence: position, origin: "purge", delta: nil)], deltas: [])
                return count
            }
            try flushToDisk()
            return changed
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }

    /// Refuses (before anything is written) changes that break a bound of ``ValidationLimits``:
    /// a delta built in memory with an over-limit value, or a join that would take the
    /// replica's context past the replica or cloud-dot limit (its peers would refuse it).
    private static func checkLimits(_ deltas: [RecordMap], joinedInto state: ReplicaState) throws(LimitViolationError) {
        for delta in deltas {
            if let violation = delta.limitViolation { throw LimitViolationError(violation) }
        }
        if !deltas.isEmpty, let violation = state.context.limitViolation {
            throw LimitViolationError("joining it would break a limit: \(violation)")
        }
    }

    /// ``checkLimits(_:joinedInto:)`` against a context the deltas are not joined into yet.
    private static func checkLimits(_ deltas: [RecordMap], joinedInto context: CausalContext) throws(LimitViolationError) {
        var joined = context
        for delta in deltas {
            if let violation = delta.limitViolation { throw LimitViolationError(violation) }
            joined.merge(delta.context)
        }
        if let violation = joined.limitViolation {
            throw LimitViolationError("joining it would break a limit: \(violation)")
        }
    }

    private func persist(
        _ db: Database, state: ReplicaState, deltas: [RecordMap], localBefore: [String: FieldValue],
        conflicts: [ConflictEntry], origin: String, position: inout Int64
    ) throws {
        if !deltas.isEmpty {
            let upsert = try db.cachedStatement(sql: """
                INSERT INTO record (collection, id, visible, state) VALUES (?, ?, ?, ?)
                ON CONFLICT (collection, id) DO UPDATE SET visible = excluded.visible, state = excluded.state
                """)
            var records = 0
            for delta in deltas {
                records += delta.recordCount
                for (collection, changed) in delta.collections {
                    let stored = state.records.records(in: collection)
                    for id in changed.keys {
                        guard let record = stored[id] else { continue }
                        try upsert.execute(arguments: [collection, id.data, record.isVisible, Data(record.encodedBlob())])
                    }
                }
            }
            try db.execute(sql: "UPDATE replica SET clock = ?, context = ?", arguments: [
                Int64(bitPattern: state.clock.latest.rawValue), Data(state.context.encodedBlob()),
            ])
            // Big changes (catch-up batches) are journaled as "reload" markers: encoding and
            // writing them twice would double the cost of a catch-up, and readers rarely need them.
            let journaled: RecordMap? = records > Self.largestJournaledRecords ? nil
                : deltas.count == 1 ? deltas[0] : deltas.reduce(into: RecordMap.empty()) { $0.merge($1) }
            try db.cachedStatement(sql: "INSERT INTO journal (committedAt, origin, summary, delta) VALUES (?, ?, ?, ?)").execute(arguments: [
                Int64(clamping: physicalClock()), origin, journaled.map(Self.summary(of:)) ?? "\(records) records",
                journaled.map { Data($0.encoded()) },
            ])
            position = db.lastInsertedRowID
            // Retention, whichever process commits: each entry whose number is a multiple of
            // pruneInterval drops the entries journalLength behind it (an indexed range delete
            // on the rowid). Numbers grow by one per commit, so the journal never holds more
            // than journalLength + pruneInterval − 1 entries.
            if position % Self.pruneInterval == 0 {
                try db.execute(sql: "DELETE FROM journal WHERE seq <= ?", arguments: [position - Self.journalLength])
            }
        }
        for (key, value) in state.localSettings where localBefore[key] != value {
            try LocalSettingRow(key: key, value: Data(value.encoded)).upsert(db)
        }
        for key in localBefore.keys where state.localSettings[key] == nil {
            _ = try LocalSettingRow.deleteOne(db, key: key)
        }
        if !conflicts.isEmpty {
            let before = try Int64.fetchOne(db, sql: "SELECT seq FROM conflict ORDER BY seq DESC LIMIT 1") ?? 0
            var last = before
            for conflict in conflicts {
                var row = ConflictRow(conflict)
                try row.insert(db)
                last = row.seq ?? last
            }
            // Same rule as the journal: crossing a multiple of pruneInterval keeps the newest
            // defaultCapacity rows, so the table never holds more than that + pruneInterval − 1.
            if before / Self.pruneInterval != last / Self.pruneInterval {
                try db.execute(sql: "DELETE FROM conflict WHERE seq <= ?", arguments: [last - Int64(ConflictLog.defaultCapacity)])
            }
        }
    }

    /// Joins journal entries after `position` into `state`. An entry without a delta, or a gap
    /// left by pruning, makes it reload the whole state instead.
    private func catchUp(_ db: Database, _ state: inout ReplicaState, _ position: inout Int64) throws -> [StoreChange] {
        // A cached statement: this runs in every transaction, and building the query through
        // the query interface cost more than the rest of a one-field commit's bookkeeping.
        let rows = try JournalRow.fetchAll(db.cachedStatement(sql: "SELECT * FROM journal WHERE seq > ? ORDER BY seq"),
                                           arguments: [position])
        guard let first = rows.first else { return [] }
        var changes: [StoreChange] = []
        if first.seq! > position + 1 && position > 0 || rows.contains(where: { $0.delta == nil }) {
            state = try Self.loadState(db, physicalClock: physicalClock, keeping: state.conflicts)
            position = rows.last!.seq!
            return [StoreChange(sequence: position, origin: "reload", delta: nil)]
        }
        for row in rows {
            let delta = try RecordMap(decoding: Array(row.delta!))
            state.apply(delta)
            position = row.seq!
            changes.append(StoreChange(sequence: position, origin: row.origin, delta: delta))
        }
        return changes
    }

    static func loadState(
        _ db: Database, physicalClock: @escaping HybridLogicalClock.PhysicalClock, keeping conflicts: ConflictLog? = nil
    ) throws -> ReplicaState {
        guard let replica = try ReplicaRow.fetchOne(db) else {
            throw BinaryDecodingError.invalid("replica row (missing)")
        }
        guard let replicaID = ReplicaID(hex: replica.replicaID) else {
            throw BinaryDecodingError.invalid("replica ID \(replica.replicaID)")
        }
        let context = try CausalContext(blob: Array(replica.context))
        var records: [(RecordKey, RecordState)] = []
        let cursor = try Row.fetchCursor(db, sql: "SELECT collection, id, state FROM record")
        while let row = try cursor.next() {
            guard let id = UUID(data: row[1]) else { throw BinaryDecodingError.invalid("record ID") }
            let blob: Data = row[2]
            records.append((RecordKey(collection: row[0], id: id), try RecordState(blob: Array(blob))))
        }
        var localSettings: [String: FieldValue] = [:]
        for row in try LocalSettingRow.fetchAll(db) {
            localSettings[row.key] = try FieldValue(decoding: Array(row.value))
        }
        let log = try conflicts ?? ConflictLog(entries: ConflictRow.order(ConflictRow.Columns.seq.desc)
            .limit(ConflictLog.defaultCapacity).fetchAll(db).reversed().map { try $0.entry() })
        let clockFloor = HLCTimestamp(rawValue: UInt64(bitPattern: replica.clock))
        guard ValidationLimits.isValidTimestamp(clockFloor) else {
            throw BinaryDecodingError.invalid("replica clock \(clockFloor) (after the year 9999)")
        }
        return ReplicaState(
            replicaID: replicaID, name: replica.name, records: RecordMap(records: records, context: context),
            localSettings: localSettings, conflicts: log, clockFloor: clockFloor, physicalClock: physicalClock)
    }

    static func summary(of delta: RecordMap) -> String {
        let records = delta.recordCount
        if records == 1, let (key, state) = delta.allRecords.first {
            if state.fields.isEmpty && state.presence.values.contains(where: { !$0.isLive }) { return "deleted \(key)" }
            return "wrote \(key) \(state.fields.keys.sorted().joined(separator: ","))"
        }
        return "\(records) records, \(delta.fieldCount) fields"
    }
}

/// A change another process committed (or this one, for the journal reader).
public struct StoreChange: Sendable {
    /// The journal's sequence number.
    public let sequence: Int64
    /// "local", or the peer it came from, or "reload".
    public let origin: String
    /// The delta that was committed; nil if the state was reloaded whole (ship a full
    /// anti-entropy round to peers then).
    public let delta: RecordMap?
}

/// One committed transaction as the journal keeps it.
public struct JournalEntry: Sendable {
    public let sequence: Int64
    /// Wall-clock milliseconds since 1970 at commit.
    public let committedAt: Int64
    public let origin: String
    public let summary: String
    /// nil for very large catch-ups, which are not kept.
    public let delta: RecordMap?
}
