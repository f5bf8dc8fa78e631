import Foundation
import GRDB
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import Synchronization

/// What a transaction writes (limits, rows, journal, retention) and how a state is read back
/// (whole, or what other processes committed since): the SQLite half of ``ReplicaStore``.
extension ReplicaStore {
    /// Refuses (before anything is written) changes that break a bound of ``ValidationLimits``:
    /// a delta built in memory with an over-limit value, or a join that would take the
    /// replica's context past the replica or cloud-dot limit (its peers would refuse it).
    static func checkLimits(_ deltas: [RecordMap], joinedInto state: ReplicaState, changed: Bool) throws(LimitViolationError) {
        for delta in deltas {
            if let violation = delta.limitViolation { throw LimitViolationError(violation) }
        }
        if changed, let violation = state.context.limitViolation {
            throw LimitViolationError("joining it would break a limit: \(violation)")
        }
    }

    /// ``checkLimits(_:joinedInto:changed:)`` against a context the deltas are not joined into yet.
    static func checkLimits(_ deltas: [RecordMap], joinedInto context: CausalContext) throws(LimitViolationError) {
        var joined = context
        for delta in deltas {
            if let violation = delta.limitViolation { throw LimitViolationError(violation) }
            joined.merge(delta.context)
        }
        if let violation = joined.limitViolation {
            throw LimitViolationError("joining it would break a limit: \(violation)")
        }
    }

    /// Writes what a transaction changed; `only` limits the record rows to those records (nil:
    /// every record of the deltas).
    func persist(
        _ db: Database, state: ReplicaState, deltas: [RecordMap], rows only: Set<RecordKey>?, localBefore: [String: FieldValue],
        conflicts: [ConflictEntry], origin: String, localEvents: CausalContext? = nil, position: inout Int64
    ) throws {
        if !deltas.isEmpty {
            let rows = try RecordRowWriter(db)
            var records = 0
            // The records to write, by collection (a record in several deltas once).
            var ids: [String: [UUID]] = [:]
            for delta in deltas {
                records += delta.recordCount
                for (collection, changed) in delta.collections {
                    for id in changed.keys where only?.contains(RecordKey(collection: collection, id: id)) ?? true {
                        ids[collection, default: []].append(id)
                    }
                }
            }
            // In the table's key order when many: a fresh peer's catch-up (many chunks, one
            // commit) then appends to the B-tree instead of splitting pages at random, and the
            // pages end up full.
            let sorted = deltas.count > 1 || records > 64
            for collection in sorted ? ids.keys.sorted(by: RecordKey.precedesInTableOrder) : Array(ids.keys) {
                // The collection's records once, then one lookup by ID per row.
                let held = state.records.records(in: collection)
                var previous: UUID?
                for id in sorted ? UUID.sortedInBlobOrder(ids[collection]!) : ids[collection]! where id != previous {
                    previous = id
                    guard let record = held[id] else { continue }
                    try rows.upsert(collection: collection, id: id, visible: record.isVisible, state: record.encodedBlob())
                }
            }
            try db.execute(sql: "UPDATE replica SET clock = ?, context = ?", arguments: [
                Int64(bitPattern: state.clock.latest.rawValue), Data(state.context.encodedBlob()),
            ])
            // Big changes (catch-up batches) are journaled as "reload" markers: encoding and
            // writing them twice would double the cost of a catch-up, and readers rarely need them.
            let journaled: RecordMap? = records > Self.largestJournaledRecords ? nil
                : deltas.count == 1 ? deltas[0] : deltas.reduce(into: RecordMap.empty()) { $0.merge($1) }
            try db.cachedStatement(sql: "INSERT INTO journal (committedAt, origin, summary, delta, events) VALUES (?, ?, ?, ?, ?)").execute(arguments: [
                Int64(clamping: physicalClock()), origin, journaled.map(Self.summary(of:)) ?? "\(records) records",
                journaled.map { Data($0.encoded()) }, localEvents.flatMap { Self.encodeEvents($0, of: state.replicaID) },
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
            // A cached statement, not the record's insert: a healing partition records hundreds.
            let insert = try db.cachedStatement(
                sql: "INSERT INTO conflict (collection, recordID, field, registers, detectedAt) VALUES (?, ?, ?, ?, ?)")
            for conflict in conflicts {
                let row = ConflictRow(conflict)
                try insert.execute(arguments: [row.collection, row.recordID, row.field, row.registers, row.detectedAt])
                last = db.lastInsertedRowID
            }
            // Same rule as the journal: crossing a multiple of pruneInterval keeps the newest
            // defaultCapacity rows, so the table never holds more than that + pruneInterval − 1.
            if before / Self.pruneInterval != last / Self.pruneInterval {
                try db.execute(sql: "DELETE FROM conflict WHERE seq <= ?", arguments: [last - Int64(ConflictLog.defaultCapacity)])
            }
        }
    }

    /// A local commit's events as `journal.events` stores them: the replica and the first and last
    /// counter (`01 ‖ replica(16) ‖ varint(first) ‖ varint(last)`: a commit issues consecutive
    /// dots, so a batch of 33,000 writes costs 20 bytes, not a cloud of 33,000), or, should they
    /// not be one run of `replica`, the context blob (`02 ‖ blob`). Nil for no events.
    static func encodeEvents(_ events: CausalContext, of replica: ReplicaID) -> Data? {
        if events.isEmpty { return nil }
        var counters: [UInt64] = []
        var inVector: UInt64 = 0
        events.forEachEntry(of: replica) { counter, inCloud in if inCloud { counters.append(counter) } else { inVector = counter } }
        if events.replicas == [replica] {
            let first = inVector > 0 ? 1 : (counters.min() ?? 0)
            let last = max(inVector, counters.max() ?? 0)
            if first > 0, UInt64(counters.count) + inVector == last - first + 1 {
                var out: [UInt8] = [1]
                replica.appendBigEndianBytes(to: &out)
                Varint.append(first, to: &out)
                Varint.append(last, to: &out)
                return Data(out)
            }
        }
        return Data([2] + events.encodedBlob())
    }

    /// Reads ``encodeEvents(_:of:)``: the replica and its counters.
    static func decodeEvents(_ data: Data) throws -> (replica: ReplicaID?, counters: Set<UInt64>, context: CausalContext?) {
        let bytes = Array(data)
        guard let format = bytes.first else { throw BinaryDecodingError.truncated("journal events") }
        if format == 2 { return (nil, [], try CausalContext(blob: Array(bytes.dropFirst()))) }
        guard format == 1, bytes.count > 17, let replica = ReplicaID(bigEndianBytes: bytes[1..<17]) else {
            throw BinaryDecodingError.invalid("journal events")
        }
        var index = 17
        func varint() throws -> UInt64 {
            var value: UInt64 = 0
            var shift: UInt64 = 0
            while index < bytes.count, shift < 64 {
                let byte = bytes[index]
                index += 1
                value |= UInt64(byte & 0x7f) << shift
                if byte & 0x80 == 0 { return value }
                shift += 7
            }
            throw BinaryDecodingError.invalid("journal events")
        }
        let first = try varint()
        let last = try varint()
        guard first >= 1, last >= first, last - first < 1 << 32, index == bytes.count else {
            throw BinaryDecodingError.invalid("journal events")
        }
        return (replica, Set(first...last), nil)
    }

    /// Joins journal entries after `position` into `state`. An entry without a delta, or a gap
    /// left by pruning, makes it reload the whole state instead.
    func catchUp(_ db: Database, _ state: inout ReplicaState, _ position: inout Int64) throws -> [StoreChange] {
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
        var state = ReplicaState(
            replicaID: replicaID, name: replica.name, records: RecordMap(records: records, context: context),
            localSettings: localSettings, conflicts: log, clockFloor: clockFloor, physicalClock: physicalClock)
        // Compaction: a loaded state drops echoes of what was purged (RecordMap.compactedThrough).
        state.purge([], stable: try storedStable(db))
        return state
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
