import Foundation
import GRDB
@_spi(Engine) import PeerSyncCRDT
import Synchronization

/// What a store keeps for compaction at causal stability (docs/ARCHITECTURE.md, "Compaction at
/// causal stability"): every replica's newest signed report, the reports this store signed
/// itself, and the frontier (the stable context `P` and its waiting candidate). Persisted by
/// migrations v5 and v6.
package struct CompactionRecord: Sendable, Equatable {
    /// The newest signed report of each other replica (checked against the roster before they
    /// are recorded; never one of this store's own replica IDs).
    public var reports = SeenReports()
    /// The last report this store signed, for each replica ID it has written with.
    public var ownReports: [ReplicaID: SeenReport] = [:]
    /// For each replica ID whose lost future this store recovered from, the newest such report's
    /// time: reports up to it are not news again.
    public var lostFutureRecovered: [ReplicaID: UInt64] = [:]
    /// The stable context and the candidate waiting for its second round.
    public var frontier = CompactionFrontier()
    /// Records purged by this store, in total.
    public var purgedRecords = 0
    /// Wall-clock milliseconds of the last compaction run, if any.
    public var lastRunAt: UInt64?

    public init() {}

    /// What each replica reported having seen (not this replica's own: that is its context).
    public var reportedContexts: [ReplicaID: CausalContext] { reports.contexts }

    /// When the report of `replica` was signed (ms since 1970), if one is held.
    public func reportedAt(_ replica: ReplicaID) -> UInt64? { reports[replica]?.time }

    /// What this replica gossips: every report held and its own current one.
    public func gossip(replicaID: ReplicaID) -> [SeenReport] {
        var all = Array(reports.byReplica.values)
        if let own = ownReports[replicaID] { all.append(own) }
        return all
    }

    /// Whether `report` (of one of this store's replica IDs, `incarnations`) was signed by a
    /// lost future of this store: it says the replica had seen something this store has not
    /// (`context`: the store's; a report this store signed is always within it, since a context
    /// only grows), or it is not the report this store signed last for that replica and not older
    /// than it. Only a store put back from a backup meets one: it signed it before the backup
    /// was restored over it (docs/ARCHITECTURE.md, "Restores"). Either test alone misses a case:
    /// the restored store may sign a report of its own (later in time) before its lost future's
    /// arrives, and it may have caught up with everything before.
    public func isFromLostFuture(_ report: SeenReport, incarnations: Set<ReplicaID>, context: CausalContext) -> Bool {
        guard incarnations.contains(report.replica), ownReports[report.replica] != report,
              report.time > lostFutureRecovered[report.replica] ?? 0 else { return false }
        if !context.includes(report.context) { return true }
        guard let own = ownReports[report.replica] else { return true }
        return report != own && report.time >= own.time
    }
}

extension ReplicaStore {
    /// The compaction bookkeeping as this process last loaded or wrote it.
    public var compaction: CompactionRecord { inner.withLock { $0.compaction } }

    /// What this replica gossips now (``CompactionRecord/gossip(replicaID:)``).
    public func seenReports() -> [SeenReport] {
        inner.withLock { $0.compaction.gossip(replicaID: $0.state.replicaID) }
    }

    /// Records peers' signed reports (the caller checked them against the roster): each replaces
    /// an older one of its replica; older, equal and conflicting ones change nothing. Reports of
    /// this store's own replica IDs are never recorded; those it did not sign come back in
    /// ``RecordedReports/fromLostFuture``. Writes only what grew, without an fsync of its own
    /// (losing a report to a crash only delays compaction).
    @discardableResult
    public func recordSeen(_ incoming: [SeenReport]) throws(StoreError) -> RecordedReports {
        var outcome = RecordedReports()
        let incarnations = (try? self.incarnations().map(\.replicaID)).map(Set.init) ?? [replicaID]
        try changingCompaction { current, own, context in
            var record = current
            var grown: [SeenReport] = []
            for report in incoming {
                if report.replica == own || incarnations.contains(report.replica) {
                    if record.isFromLostFuture(report, incarnations: incarnations.union([own]), context: context),
                       !outcome.fromLostFuture.contains(report) {
                        outcome.fromLostFuture.append(report)
                    }
                    continue
                }
                if record.reports.record(report) { grown.append(report) }
            }
            guard !grown.isEmpty else { return nil }
            outcome.grew = true
            try run { db in
                let upsert = try db.cachedStatement(sql: """
                    INSERT INTO seen (replicaID, report) VALUES (?, ?)
                    ON CONFLICT (replicaID) DO UPDATE SET report = excluded.report
                    """)
                for report in grown {
                    // Another process may have recorded a newer one: keep the newer.
                    let key = Data(report.replica.bigEndianBytes)
                    if let stored = try Data.fetchOne(db, sql: "SELECT report FROM seen WHERE replicaID = ?", arguments: [key]),
                       let held = try? SeenReport(bytes: Array(stored)), held.time > report.time {
                        record.reports.record(held)
                        continue
                    }
                    try upsert.execute(arguments: [key, Data(report.bytes)])
                }
            }
            return record
        }
        return outcome
    }

    /// Stores a report this store signed (before it is sent, so a crash never lets the store
    /// sign a second report for the same time and take it later for its lost future's).
    public func saveOwnReport(_ report: SeenReport) throws(StoreError) {
        try changingCompaction { current, _, _ in
            try run { db in
                try db.execute(sql: """
                    INSERT INTO ownReport (replicaID, report) VALUES (?, ?)
                    ON CONFLICT (replicaID) DO UPDATE SET report = excluded.report
                    """, arguments: [Data(report.replica.bigEndianBytes), Data(report.bytes)])
            }
            var record = current
            record.ownReports[report.replica] = report
            return record
        }
        try flushToDisk()
    }

    /// Notes that this store recovered from the lost future that signed `report` (it moved its
    /// writes since the restore): that report, and older ones, are not taken for news again.
    public func acknowledgeLostFuture(_ report: SeenReport) throws(StoreError) {
        try changingCompaction { current, _, _ in
            guard report.time > current.lostFutureRecovered[report.replica] ?? 0 else { return nil }
            try run { db in
                try db.execute(sql: """
                    INSERT INTO lostFuture (replicaID, time) VALUES (?, ?)
                    ON CONFLICT (replicaID) DO UPDATE SET time = excluded.time
                    """, arguments: [Data(report.replica.bigEndianBytes), Int64(clamping: report.time)])
            }
            var record = current
            record.lostFutureRecovered[report.replica] = report.time
            return record
        }
    }

    /// Drops the reports of replicas for which `keep` is false (removed devices, older
    /// incarnations), so the table stays bounded by the roster.
    public func retainSeen(_ keep: (ReplicaID) -> Bool) throws(StoreError) {
        try changingCompaction { current, _, _ in
            let gone = current.reports.byReplica.keys.filter { !keep($0) }
            guard !gone.isEmpty else { return nil }
            try run { db in
                for replica in gone {
                    try db.execute(sql: "DELETE FROM seen WHERE replicaID = ?", arguments: [Data(replica.bigEndianBytes)])
                }
            }
            var record = current
            record.reports.retain(keep)
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

    /// The reports on disk.
    static func loadReports(_ db: Database, into record: inout CompactionRecord) throws {
        for row in try Row.fetchAll(db, sql: "SELECT report FROM seen") {
            record.reports.record(try SeenReport(bytes: Array(row[0] as Data)))
        }
        for row in try Row.fetchAll(db, sql: "SELECT report FROM ownReport") {
            let report = try SeenReport(bytes: Array(row[0] as Data))
            record.ownReports[report.replica] = report
        }
        for row in try Row.fetchAll(db, sql: "SELECT replicaID, time FROM lostFuture") {
            guard let replica = ReplicaID(bigEndianBytes: Array(row[0] as Data)) else { throw BinaryDecodingError.invalid("lostFuture: replica ID") }
            record.lostFutureRecovered[replica] = UInt64(max(0, row[1] as Int64))
        }
    }
}
