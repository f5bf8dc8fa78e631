import Foundation
import GRDB
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import Synchronization

/// What one compaction run did.
package struct CompactionRun: Sendable, Equatable {
    /// Records purged, with their field registers and presence entries.
    public var purgedRecords = 0
    public var purgedFields = 0
    public var purgedPresence = 0
    /// Transactions (batches) it took.
    public var batches = 0
    /// Deleted records still held: their deletion is not stable yet.
    public var remainingDeleted = 0
    /// Journal entries dropped (they held deltas of purged records).
    public var journalEntriesDropped = 0
    /// Size of the database file and its WAL before and after.
    public var bytesBefore = 0
    public var bytesAfter = 0

    public init() {}
}

extension ReplicaStore {
    /// Records per compaction transaction: a batch holds the store's lock (and SQLite's write
    /// lock) for a few milliseconds, so edits never wait long.
    public static let compactionBatchSize = 1_000

    /// Purges the deleted records whose every dot is in `stable`, a bounded batch per
    /// transaction: each batch reads the next `batchSize` invisible rows (`visible = 0`, in key
    /// order), purges the purgeable ones from memory and deletes their rows (and their conflict
    /// rows) in one transaction, records `stable` as `P`, and returns the freed pages to the file
    /// system (`PRAGMA incremental_vacuum`). Between batches the lock is free, so edits and sync
    /// go on. At the end it drops the journal entries before its last marker (a reader behind
    /// the marker reloads the whole state, so they are never read again; they hold deltas of
    /// what was purged) and truncates the WAL.
    ///
    /// The first run that purges something on a store made before `auto_vacuum = INCREMENTAL`
    /// switches it with a one-time `VACUUM` (it rewrites the file once).
    ///
    /// `stable` must be stable for this replica's group (``CompactionFrontier``); it is joined
    /// into the stored `P`. `shouldContinue` is asked after each batch.
    @discardableResult
    public func compact(
        stable: CausalContext, batchSize: Int = ReplicaStore.compactionBatchSize,
        shouldContinue: (CompactionRun) -> Bool = { _ in true }
    ) throws(StoreError) -> CompactionRun {
        var run = CompactionRun()
        run.bytesBefore = bytesOnDisk()
        do {
            var after: (collection: String, id: Data)?
            var finished = false
            while !finished {
                finished = try compactBatch(stable: stable, limit: max(1, batchSize), after: &after, run: &run)
                run.batches += 1
                if !finished && !shouldContinue(run) { break }
            }
            if run.purgedRecords > 0 {
                try returnSpace(run: &run)
            }
            try flushToDisk()
        } catch {
            throw StoreError.wrap(error, path: path)
        }
        run.remainingDeleted = state.records.invisibleRecordCount
        run.bytesAfter = bytesOnDisk()
        return run
    }

    /// One batch; returns whether the scan reached the end of the table.
    private func compactBatch(stable: CausalContext, limit: Int, after: inout (collection: String, id: Data)?,
                              run result: inout CompactionRun) throws -> Bool {
        try changingState { inner -> Bool in
            // Take the state out so it is uniquely referenced (see `committing`).
            var state = inner.state
            inner.state = ReplicaState(replicaID: state.replicaID, name: state.name)
            var position = inner.position
            var absorbed: [StoreChange] = []
            var record = inner.compaction
            var purged = RecordMap.PurgeResult()
            let finished: Bool
            do {
                finished = try run { db -> Bool in
                    absorbed = try catchUp(db, &state, &position)
                    let rows: [Row] = if let after {
                        try Row.fetchAll(db.cachedStatement(sql: """
                            SELECT collection, id FROM record WHERE visible = 0 AND (collection > ? OR (collection = ? AND id > ?))
                            ORDER BY collection, id LIMIT ?
                            """), arguments: [after.collection, after.collection, after.id, limit])
                    } else {
                        try Row.fetchAll(db.cachedStatement(sql: """
                            SELECT collection, id FROM record WHERE visible = 0 ORDER BY collection, id LIMIT ?
                            """), arguments: [limit])
                    }
                    if let last = rows.last { after = (last[0], last[1]) }
                    let keys = rows.compactMap { row -> RecordKey? in
                        UUID(data: row[1]).map { RecordKey(collection: row[0], id: $0) }
                    }
                    purged = state.purge(keys, stable: stable)
                    var frontier = record.frontier
                    frontier.merge(CompactionFrontier(stable: stable))
                    record.frontier = frontier
                    try Self.saveFrontier(db, &record.frontier)
                    if !purged.isEmpty {
                        let delete = try db.cachedStatement(sql: "DELETE FROM record WHERE collection = ? AND id = ?")
                        for key in purged.keys { try delete.execute(arguments: [key.collection, key.id.data]) }
                        // The conflict log holds at most ~1,000 rows: look them up once per batch.
                        let gone = Set(purged.keys)
                        for row in try Row.fetchAll(db, sql: "SELECT seq, collection, recordID FROM conflict") {
                            guard let id = UUID(data: row[2]), gone.contains(RecordKey(collection: row[1], id: id)) else { continue }
                            try db.execute(sql: "DELETE FROM conflict WHERE seq = ?", arguments: [row[0] as Int64])
                        }
                        record.purgedRecords += purged.keys.count
                        record.lastRunAt = UInt64(max(0, physicalClock()))
                        try db.execute(sql: "UPDATE compaction SET purgedRecords = ?, lastRunAt = ?",
                                       arguments: [record.purgedRecords, Int64(clamping: record.lastRunAt!)])
                        // Other processes hold the purged records: a marker without a delta makes them reload.
                        var marker = JournalRow(committedAt: Int64(clamping: physicalClock()), origin: "compaction",
                                                summary: "purged \(purged.keys.count) deleted records", delta: nil)
                        try marker.insert(db)
                        position = marker.seq ?? position
                        try db.execute(sql: "PRAGMA incremental_vacuum")
                    }
                    return rows.count < limit
                }
            } catch {
                inner.state = (try? pool.read { db in try Self.loadState(db, physicalClock: physicalClock) }) ?? state
                if !absorbed.isEmpty { commits.publish(state: inner.state, absorbed: absorbed, deltas: []) }
                throw error
            }
            inner.state = state
            inner.position = position
            inner.absorbed += absorbed
            inner.compaction = record
            if !purged.isEmpty || !absorbed.isEmpty {
                let marker = purged.isEmpty ? [] : [StoreChange(sequence: position, origin: "compaction", delta: nil)]
                commits.publish(state: state, absorbed: absorbed + marker, deltas: [])
            }
            result.purgedRecords += purged.keys.count
            result.purgedFields += purged.fieldCount
            result.purgedPresence += purged.presenceCount
            return finished
        }
    }

    /// Returns free pages to the file system and truncates the WAL (what a compaction run does
    /// at its end), e.g. before measuring the file.
    public func returnFreeSpace() throws(StoreError) {
        do {
            try pool.writeWithoutTransaction { db in
                try db.execute(sql: "PRAGMA incremental_vacuum")
                _ = try? Row.fetchOne(db, sql: "PRAGMA wal_checkpoint(TRUNCATE)")
            }
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }

    /// After a run that purged: old journal entries go, the file switches to incremental
    /// vacuum if it is not yet, free pages go back to the file system, the WAL is truncated.
    private func returnSpace(run result: inout CompactionRun) throws {
        try run { db in
            // Everything before the run's newest marker (every purging batch writes one): a reader
            // behind it reloads the whole state when it reaches it (a row without a delta, or a
            // gap), so older rows are never read again — and they hold the purged records'
            // deltas. This also drops the run's other markers (100 for 100,000 records).
            // Local commits keep their row without its delta: their `events` say which of this
            // store's own events were made when (the writes since a restore, ReplicaStore+Restore).
            let marker = "(SELECT max(seq) FROM journal WHERE origin = 'compaction' AND delta IS NULL)"
            try db.execute(sql: "DELETE FROM journal WHERE seq < \(marker) AND events IS NULL")
            result.journalEntriesDropped = db.changesCount
            try db.execute(sql: "UPDATE journal SET delta = NULL WHERE seq < \(marker) AND delta IS NOT NULL")
        }
        try pool.writeWithoutTransaction { db in
            if try Int.fetchOne(db, sql: "PRAGMA auto_vacuum") != 2 {
                // Takes effect on an existing database only through a VACUUM (once per store).
                try db.execute(sql: "PRAGMA auto_vacuum = INCREMENTAL")
                try db.execute(sql: "VACUUM")
            }
            try db.execute(sql: "PRAGMA incremental_vacuum")
            // Best effort: a reader in another process may keep the WAL from being truncated now.
            _ = try? Row.fetchOne(db, sql: "PRAGMA wal_checkpoint(TRUNCATE)")
        }
    }

    /// Writes `frontier`, its stable context joined with the stored one (another process may
    /// have advanced it), and leaves the joined one in `frontier`.
    static func saveFrontier(_ db: Database, _ frontier: inout CompactionFrontier) throws {
        if let row = try Row.fetchOne(db, sql: "SELECT stable FROM compaction") {
            let stored = try CausalContext(blob: Array(row[0] as Data))
            if !frontier.stable.includes(stored) { frontier.merge(CompactionFrontier(stable: stored)) }
        }
        try db.execute(sql: """
            INSERT INTO compaction (singleton, stable, candidate) VALUES (1, ?, ?)
            ON CONFLICT (singleton) DO UPDATE SET stable = excluded.stable, candidate = excluded.candidate
            """, arguments: [Data(frontier.stable.encodedBlob()), frontier.candidate.map { Data(encode($0)) }])
    }

    /// The compaction bookkeeping on disk.
    static func loadCompaction(_ db: Database) throws -> CompactionRecord {
        var record = CompactionRecord()
        try loadReports(db, into: &record)
        if let row = try Row.fetchOne(db, sql: "SELECT stable, candidate, purgedRecords, lastRunAt FROM compaction") {
            let stable = try CausalContext(blob: Array(row[0] as Data))
            let candidate = try (row[1] as Data?).map { try decodeCandidate(Array($0)) }
            record.frontier = CompactionFrontier(stable: stable, candidate: candidate)
            record.purgedRecords = row[2]
            record.lastRunAt = (row[3] as Int64?).map { UInt64(max(0, $0)) }
        }
        return record
    }

    /// The stable context on disk (empty before the first compaction).
    static func storedStable(_ db: Database) throws -> CausalContext {
        guard let blob = try Data.fetchOne(db, sql: "SELECT stable FROM compaction") else { return CausalContext() }
        return try CausalContext(blob: Array(blob))
    }

    /// A candidate as a blob: version 1, member count, member IDs, meet and writers contexts
    /// (each length-prefixed).
    static func encode(_ candidate: CompactionFrontier.Candidate) -> [UInt8] {
        var out: [UInt8] = [1]
        Varint.append(UInt64(candidate.members.count), to: &out)
        for member in candidate.members.sorted() { member.appendBigEndianBytes(to: &out) }
        for context in [candidate.meet, candidate.writers] {
            let blob = context.encodedBlob()
            Varint.append(UInt64(blob.count), to: &out)
            out += blob
        }
        return out
    }

    static func decodeCandidate(_ blob: [UInt8]) throws -> CompactionFrontier.Candidate {
        var reader = blob[...]
        func varint() throws -> Int {
            var value: UInt64 = 0
            var shift: UInt64 = 0
            while let byte = reader.popFirst() {
                value |= UInt64(byte & 0x7f) << shift
                if byte & 0x80 == 0 { return value <= UInt64(Int32.max) ? Int(value) : -1 }
                shift += 7
                if shift >= 64 { break }
            }
            throw BinaryDecodingError.invalid("compaction candidate")
        }
        guard reader.popFirst() == 1 else { throw BinaryDecodingError.invalid("compaction candidate version") }
        let count = try varint()
        guard count >= 0, count <= ValidationLimits.maxContextReplicas, reader.count >= count * 16 else {
            throw BinaryDecodingError.invalid("compaction candidate members")
        }
        var members = Set<ReplicaID>()
        for _ in 0..<count {
            members.insert(ReplicaID(bigEndianBytes: reader.prefix(16))!)
            reader = reader.dropFirst(16)
        }
        var contexts: [CausalContext] = []
        for _ in 0..<2 {
            let length = try varint()
            guard length >= 0, reader.count >= length else { throw BinaryDecodingError.invalid("compaction candidate context") }
            contexts.append(try CausalContext(blob: Array(reader.prefix(length))))
            reader = reader.dropFirst(length)
        }
        guard reader.isEmpty else { throw BinaryDecodingError.invalid("compaction candidate: trailing bytes") }
        return CompactionFrontier.Candidate(members: members, meet: contexts[0], writers: contexts[1])
    }
}
