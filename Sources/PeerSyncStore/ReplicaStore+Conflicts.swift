import Foundation
import GRDB
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel

/// A conflict as the store keeps it: the entry, its row number and whether an app marked it
/// resolved.
package struct StoredConflict: Hashable, Sendable {
    /// The row's sequence number: stable, unique in this store.
    public let id: Int64
    /// The record, field, winner, loser and detection time.
    public let entry: ConflictEntry
    /// Whether an app marked it resolved (``ReplicaStore/markConflict(_:resolved:)``).
    public let isResolved: Bool
    /// The writers' names as first resolved (``ReplicaStore/nameConflicts(_:)``), if they were.
    public let winnerName: String?
    public let loserName: String?
}

extension ReplicaStore {
    /// The newest `limit` conflicts, oldest first, with their resolved flags (all processes'
    /// detections). With `unresolvedOnly`, entries marked resolved are left out.
    public func storedConflicts(limit: Int = ConflictLog.defaultCapacity,
                                unresolvedOnly: Bool = false) throws(StoreError) -> [StoredConflict] {
        do {
            return try pool.read { db in
                let rows = try Row.fetchAll(db, sql: """
                    SELECT * FROM conflict \(unresolvedOnly ? "WHERE NOT resolved" : "") ORDER BY seq DESC LIMIT ?
                    """, arguments: [limit])
                return try rows.reversed().map { row in
                    let entry = try ConflictRow(row: row).entry()
                    return StoredConflict(id: row["seq"], entry: entry, isResolved: row["resolved"],
                                          winnerName: row["winnerName"], loserName: row["loserName"])
                }
            }
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }

    /// Stores the writers' names of conflicts that had none (a name already stored is kept:
    /// the name the writer had when the conflict was first shown). Local, like the log; no
    /// notice (the names were shown already).
    public func nameConflicts(_ names: [(id: Int64, winner: String?, loser: String?)]) throws(StoreError) {
        guard !names.isEmpty else { return }
        do {
            try pool.write { db in
                for (id, winner, loser) in names {
                    try db.execute(sql: """
                        UPDATE conflict SET winnerName = coalesce(winnerName, ?), loserName = coalesce(loserName, ?) WHERE seq = ?
                        """, arguments: [winner, loser, id])
                }
            }
            try flushToDisk()
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }

    /// Marks the conflict `id` resolved (or, with `false`, pending again). The flag is local
    /// to this device, like the log. Returns false if there is no such conflict (it may have
    /// been pruned: the log keeps the newest 1,000).
    @discardableResult
    public func markConflict(_ id: Int64, resolved: Bool = true) throws(StoreError) -> Bool {
        let changed: Bool
        do {
            changed = try pool.write { db in
                try db.execute(sql: "UPDATE conflict SET resolved = ? WHERE seq = ?", arguments: [resolved, id])
                return db.changesCount > 0
            }
            try flushToDisk()
        } catch {
            throw StoreError.wrap(error, path: path)
        }
        if changed { commits.publishConflictsChanged() }
        return changed
    }
}
