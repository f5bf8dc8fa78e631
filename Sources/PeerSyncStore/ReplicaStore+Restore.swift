import Foundation
import GRDB
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel

/// A store that comes back from the past (docs/ARCHITECTURE.md, "Restores"): the writes it made
/// under an old replica ID since it was restored move to its current one, and complete rounds
/// from peers drop what the group purged meanwhile.
extension ReplicaStore {
    /// The dots of the local events this store journaled under `replica` after `milliseconds`
    /// (wall clock, ms since 1970) — its own writes and deletes since then — and the journal
    /// entries that hold them.
    public func localEvents(of replica: ReplicaID, after milliseconds: UInt64) throws(StoreError) -> (counters: Set<UInt64>, entries: [Int64]) {
        try read { db in
            var counters = Set<UInt64>()
            var entries: [Int64] = []
            let rows = try Row.fetchAll(db, sql: "SELECT seq, events FROM journal WHERE events IS NOT NULL AND committedAt > ?",
                                        arguments: [Int64(clamping: milliseconds)])
            for row in rows {
                let events = try Self.decodeEvents(row[1] as Data)
                if let of = events.replica {
                    guard of == replica else { continue }
                    counters.formUnion(events.counters)
                } else if let context = events.context {
                    guard context.replicas.contains(replica) else { continue }
                    // A commit's events are its own dots: a contiguous entry (1...n) only for
                    // the first commits of a replica.
                    context.forEachEntry(of: replica) { counter, inCloud in
                        if inCloud { counters.insert(counter) } else { counters.formUnion(1...counter) }
                    }
                }
                entries.append(row[0])
            }
            return (counters, entries)
        }
    }

    /// Moves the writes this store made under `old` after `milliseconds` (its journal says which,
    /// ``localEvents(of:after:)``) to its current replica ID, keeping their timestamps and values
    /// (``RecordMap/movingEvents(_:of:to:firstCounter:)``). Called when the store learns that it
    /// was put back from a backup in place and wrote on under `old` meanwhile: a lost future of
    /// it had used those counters, so peers take them as seen. Other processes reload. Returns
    /// how many events moved.
    @discardableResult
    public func moveWritesSinceRestore(of old: ReplicaID, after milliseconds: UInt64) throws(StoreError) -> Int {
        let (counters, entries) = try localEvents(of: old, after: milliseconds)
        guard !counters.isEmpty else { return 0 }
        return try rewritingState(origin: "restore") { db, state in
            let current = state.replicaID
            let first = state.context.maxCounter(of: current) + 1
            guard let (records, changed) = state.records.movingEvents(counters, of: old, to: current, firstCounter: first) else { return (0, nil) }
            let rows = try RecordRowWriter(db)
            for key in changed {
                guard let record = records.record(key) else { continue }
                try rows.upsert(collection: key.collection, id: key.id, visible: record.isVisible, state: record.encodedBlob())
            }
            let count = Int(records.context.maxCounter(of: current) - first + 1)
            try db.execute(sql: "UPDATE replica SET context = ?", arguments: [Data(records.context.encodedBlob())])
            // Moved once: these commits' events are not the old replica's any more (its lost
            // future's events under the same counters may arrive next).
            for entry in entries { try db.execute(sql: "UPDATE journal SET events = NULL WHERE seq = ?", arguments: [entry]) }
            state = ReplicaState(replicaID: current, name: state.name, records: records, localSettings: state.localSettings,
                                 conflicts: state.conflicts, clockFloor: state.clock.latest, physicalClock: physicalClock)
            return (count, "moved \(count) writes made since a restore from \(old.shortDescription) to \(current.shortDescription)")
        }
    }

    /// Joins the deltas of one commit (as ``applyRemoteEach(_:from:)``) and then, for each
    /// complete round among them, drops what the group purged while this store was in the past:
    /// the records the round did not carry whose every dot is in its stable context
    /// (``RecordMap/recordsPurgedElsewhere(completeKeys:stable:)``,
    /// ``RecordMap/dropPurgedElsewhere(_:stable:)``), in the same transaction; that stable
    /// context (as far as this store has seen it) joins the stored one, so echoes of those
    /// records stay out after a restart too. Other processes reload. Returns the outcomes and
    /// the records dropped.
    public func applyRemoteEach(
        _ deltas: [RecordMap], from origin: String, origins: [ChangeOrigin]? = nil, bySync: Bool = false,
        completing rounds: [CompleteRound]
    ) throws(StoreError) -> (outcomes: [MergeOutcome], dropped: [RecordKey]) {
        guard !rounds.isEmpty else { return (try applyRemoteEach(deltas, from: origin, origins: origins, bySync: bySync), []) }
        do {
            try Self.checkLimits(deltas, joinedInto: inner.withLock { $0.state.context })
            let records = deltas.reduce(0) { $0 + $1.recordCount }
            typealias Result = (outcomes: [MergeOutcome], dropped: [RecordKey], stable: CausalContext)
            let result = try transaction(origin: origin, changeOrigins: origins, bySync: bySync, deltasChecked: true, records: records, also: { (db: Database, result: Result) in
                guard !result.dropped.isEmpty else { return }
                let delete = try db.cachedStatement(sql: "DELETE FROM record WHERE collection = ? AND id = ?")
                for key in result.dropped { try delete.execute(arguments: [key.collection, key.id.data]) }
                var frontier = CompactionFrontier(stable: result.stable)
                try Self.saveFrontier(db, &frontier)
                var marker = JournalRow(committedAt: Int64(physicalClock()), origin: "restore",
                                        summary: "dropped \(result.dropped.count) records the group purged while this store was away", delta: nil)
                try marker.insert(db)
            }) { state in
                let outcomes = deltas.map { state.apply($0) }
                var dropped: [RecordKey] = []
                var stable = CausalContext()
                for round in rounds {
                    let seen = round.stable.intersection(state.context)
                    let keys = state.records.recordsPurgedElsewhere(completeKeys: round.keys, stable: seen)
                    dropped += state.dropPurgedElsewhere(keys, stable: seen).keys
                    stable.merge(seen)
                }
                return ((outcomes, dropped, stable), deltas)
            }
            if !result.dropped.isEmpty {
                // Live queries and other readers in this process re-read what they show.
                inner.withLock { inner in
                    inner.compaction.frontier.merge(CompactionFrontier(stable: result.stable))
                    commits.publish(state: inner.state, absorbed: [StoreChange(sequence: inner.position, origin: "restore", delta: nil)], deltas: [])
                }
            }
            return (result.outcomes, result.dropped)
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }
}
