import Foundation
import GRDB
import PeerSyncCRDT
import Synchronization

/// What a store keeps for compaction at causal stability (docs/ARCHITECTURE.md, "Compaction at
/// causal stability"): the gossip's reports with the time each last grew here, and the frontier
/// (the stable context `P` and its waiting candidate). Persisted by migration v5.
public struct CompactionRecord: Sendable, Equatable {
    /// What each replica reported having seen (never this replica's own: that is its context).
    public var reports: [ReplicaID: CausalContext] = [:]
    /// Wall-clock milliseconds when each report last grew here.
    public var reportedAt: [ReplicaID: UInt64] = [:]
    /// The stable context and the candidate waiting for its second round.
    public var frontier = CompactionFrontier()
    /// Records purged by this store, in total.
    public var purgedRecords = 0
    /// Wall-clock milliseconds of the last compaction run, if any.
    public var lastRunAt: UInt64?

    public init() {}

    /// The gossip this replica sends: the reports, its own context under its own ID, and `P`.
    public func gossip(replicaID: ReplicaID, context: CausalContext) -> SeenContexts {
        var seen = SeenContexts(reports: reports, stable: frontier.stable)
        seen.record(replicaID, seen: context)
        return seen
    }
}

extension ReplicaStore {
    /// The compaction bookkeeping as this process last loaded or wrote it.
    public var compaction: CompactionRecord { inner.withLock { $0.compaction } }

    /// What this replica gossips now (``CompactionRecord/gossip(replicaID:context:)``).
    public func seenGossip() -> SeenContexts {
        inner.withLock { $0.compaction.gossip(replicaID: $0.state.replicaID, context: $0.state.context) }
    }

    /// Joins gossip (a peer's `seen` message, or a peer's context from its ack as one report):
    /// reports grow by union, stamped with `now` (wall-clock ms) when they grew; the peer's
    /// stable context joins `P`, cut to what this replica has seen (a stable dot is one every
    /// member has seen; one this replica lacks is not stable here yet). This replica's own ID
    /// is skipped. Writes only what grew, without an fsync of its own (losing a report to a
    /// crash only delays compaction). Returns whether anything grew.
    @discardableResult
    public func recordSeen(_ gossip: SeenContexts, now: UInt64) throws(StoreError) -> Bool {
        try changingCompaction { current, own, context in
            var record = current
            var grown: [ReplicaID] = []
            for (replica, report) in gossip.reports where replica != own {
                let before = record.reports[replica]
                if let before, before.includes(report) { continue }
                var joined = before ?? CausalContext()
                joined.merge(report)
                record.reports[replica] = joined
                record.reportedAt[replica] = now
                grown.append(replica)
            }
            let stable = gossip.stable.intersection(context)
            let stableGrew = !record.frontier.stable.includes(stable)
            if stableGrew { record.frontier.merge(CompactionFrontier(stable: stable)) }
            guard !grown.isEmpty || stableGrew else { return nil }
            try run { db in
                let upsert = try db.cachedStatement(sql: """
                    INSERT INTO seen (replicaID, context, reportedAt) VALUES (?, ?, ?)
                    ON CONFLICT (replicaID) DO UPDATE SET context = excluded.context, reportedAt = excluded.reportedAt
                    """)
                for replica in grown {
                    // Another process may have recorded more: join with what is stored.
                    var context = record.reports[replica]!
                    if let stored = try Data.fetchOne(db, sql: "SELECT context FROM seen WHERE replicaID = ?",
                                                      arguments: [Data(replica.bigEndianBytes)]) {
                        context.merge(try CausalContext(blob: Array(stored)))
                    }
                    record.reports[replica] = context
                    try upsert.execute(arguments: [Data(replica.bigEndianBytes), Data(context.encodedBlob()),
                                                   Int64(clamping: now)])
                }
                if stableGrew { try Self.saveFrontier(db, &record.frontier) }
            }
            return record
        }
    }

    /// Drops the reports of replicas for which `keep` is false (removed devices, older
    /// incarnations), so the table stays bounded by the roster.
    public func retainSeen(_ keep: (ReplicaID) -> Bool) throws(StoreError) {
        try changingCompaction { current, _, _ in
            let gone = current.reports.keys.filter { !keep($0) }
            guard !gone.isEmpty else { return nil }
            try run { db in
                for replica in gone {
                    try db.execute(sql: "DELETE FROM seen WHERE replicaID = ?", arguments: [Data(replica.bigEndianBytes)])
                }
            }
            var record = current
            for replica in gone {
                record.reports[replica] = nil
                record.reportedAt[replica] = nil
            }
            return record
        }
    }

    /// Stores an advanced frontier (its stable context joins the stored one; the candidate
    /// replaces it).
    public func saveFrontier(_ frontier: CompactionFrontier) throws(StoreError) {
        try changingCompaction { current, _, _ in
            var merged = frontier
            try run { db in try Self.saveFrontier(db, &merged) }
            var record = current
            record.frontier = merged
            return record
        }
    }

    /// Changes the compaction record with `body`, which gets the record, this replica's ID and
    /// its context, writes SQLite itself and returns the new record (nil: nothing changed).
    /// Returns whether it changed.
    ///
    /// `writer` is held throughout, as by every change of the state or the record, so nothing
    /// changes either meanwhile; the state lock only to read and to publish. Readers (a sync
    /// node's snapshots) never wait for the SQLite write — nor for a WAL checkpoint that its
    /// commit runs: gossip arrives during a heal's large commits, and it held the state lock
    /// through such a checkpoint.
    @discardableResult
    private func changingCompaction(
        _ body: (CompactionRecord, ReplicaID, CausalContext) throws -> CompactionRecord?
    ) throws(StoreError) -> Bool {
        do {
            return try writer.withLock { _ in
                let (record, own, context) = inner.withLock { ($0.compaction, $0.state.replicaID, $0.state.context) }
                guard let changed = try body(record, own, context) else { return false }
                inner.withLock { $0.compaction = changed }
                return true
            }
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }
}
