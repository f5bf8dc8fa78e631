import Foundation
import GRDB
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import Synchronization

extension ReplicaStore {
    /// Replaces the stored state of some records (nil or an empty state removes the record)
    /// without changing the context, so nothing removed can come back as "missing": used to purge
    /// what the roster refuses (a removed device's writes past its cutoff) and deleted records
    /// every device has seen (compaction). `compute` sees the latest state (other processes'
    /// commits joined) and returns the replacements. Other processes reload. Returns how many
    /// records changed.
    @discardableResult
    public func replaceRecords(reason: String, _ compute: (ReplicaState) -> [RecordKey: RecordState?]) throws(StoreError) -> Int {
        try rewritingState(origin: "purge") { db, state in
            let replacements = compute(state)
            guard !replacements.isEmpty else { return (0, nil) }
            let rows = try RecordRowWriter(db)
            let delete = try db.cachedStatement(sql: "DELETE FROM record WHERE collection = ? AND id = ?")
            var records = Dictionary(uniqueKeysWithValues: state.records.allRecords.map { ($0.0, $0.1) })
            for (key, replacement) in replacements {
                if let replacement, !(replacement.fields.isEmpty && replacement.presence.isEmpty) {
                    try rows.upsert(collection: key.collection, id: key.id, visible: replacement.isVisible, state: replacement.encodedBlob())
                    records[key] = replacement
                } else {
                    try delete.execute(arguments: [key.collection, key.id.data])
                    records[key] = nil
                }
            }
            state = ReplicaState(
                replicaID: state.replicaID, name: state.name, records: RecordMap(records: records.map { ($0.key, $0.value) }, context: state.context),
                localSettings: state.localSettings, conflicts: state.conflicts, clockFloor: state.clock.latest,
                physicalClock: physicalClock)
            return (replacements.count, "\(reason): \(replacements.count) records")
        }
    }

    /// A change of the state outside the ordinary commit path (its result is not a delta to
    /// ship): `body` gets the latest state (other processes' commits joined) in one transaction,
    /// writes its rows, replaces the state and returns a count and a journal summary (nil:
    /// nothing changed, nothing written). A journal marker without a delta makes other processes
    /// reload; the rebuilt state keeps dropping echoes of what compaction purged; subscribers are
    /// told to re-read (a change without a delta). Returns the count.
    func rewritingState(origin: String, _ body: (Database, inout ReplicaState) throws -> (Int, String?)) throws(StoreError) -> Int {
        do {
            let changed = try changingState { inner in
                var state = inner.state
                var position = inner.position
                var absorbed: [StoreChange] = []
                let count = try run { db -> Int in
                    absorbed = try catchUp(db, &state, &position)
                    let (count, summary) = try body(db, &state)
                    guard let summary else { return count }
                    var marker = JournalRow(committedAt: Int64(physicalClock()), origin: origin, summary: summary, delta: nil)
                    try marker.insert(db)
                    position = marker.seq ?? position
                    // A rebuilt map must still drop echoes of what compaction purged.
                    state.purge([], stable: try Self.storedStable(db))
                    return count
                }
                inner.state = state
                inner.position = position
                inner.absorbed += absorbed
                commits.publish(state: state, absorbed: absorbed + [StoreChange(sequence: position, origin: origin, delta: nil)], deltas: [])
                return count
            }
            try flushToDisk()
            return changed
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }
}
