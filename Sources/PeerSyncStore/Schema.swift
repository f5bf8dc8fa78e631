import GRDB

/// The store's tables. Migrations are named and never edited once shipped; a change is a new
/// migration appended at the end.
///
/// ```
/// replica       one row: identity, name, clock floor, causal context (blob)
/// record        one row per record: (collection, id) → visible flag + RecordState blob
/// localSetting  device-local settings, never synced
/// conflict      the conflict log (bounded); `resolved` marks entries an app settled (v4); the
///               writers' names as first resolved (v7)
/// journal       every committed change as a delta blob, for other processes and `peersync log`
/// incarnation   every replica ID this store has written with, and why it changed
/// seen          compaction gossip: each replica's newest *signed* report (v5; signed since v6)
/// compaction    one row: the stable context, the frontier's waiting candidate, totals (v5)
/// ownReport     the last report this store signed, per replica ID it has written with (v6)
/// lostFuture    per replica ID, the newest report of a lost future this store recovered from (v6)
/// ```
enum Schema {
    static let migrator: DatabaseMigrator = {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("2026-11-21 v1: replica, record, localSetting, conflict, journal") { db in
            try db.create(table: ReplicaRow.databaseTableName) { t in
                t.column("singleton", .integer).primaryKey().check { $0 == 1 }
                t.column("replicaID", .text).notNull()
                t.column("name", .text).notNull()
                t.column("createdAt", .integer).notNull()
                t.column("clock", .integer).notNull()
                t.column("context", .blob).notNull()
            }
            try db.create(table: RecordRow.databaseTableName, options: .withoutRowID) { t in
                t.column("collection", .text).notNull()
                t.column("id", .blob).notNull()
                t.column("visible", .boolean).notNull()
                t.column("state", .blob).notNull()
                t.primaryKey(["collection", "id"])
            }
            try db.create(table: LocalSettingRow.databaseTableName) { t in
                t.column("key", .text).primaryKey()
                t.column("value", .blob).notNull()
            }
            try db.create(table: ConflictRow.databaseTableName) { t in
                t.autoIncrementedPrimaryKey("seq")
                t.column("collection", .text).notNull()
                t.column("recordID", .blob).notNull()
                t.column("field", .text).notNull()
                t.column("registers", .blob).notNull()
                t.column("detectedAt", .integer).notNull()
            }
            try db.create(table: JournalRow.databaseTableName) { t in
                t.autoIncrementedPrimaryKey("seq")
                t.column("committedAt", .integer).notNull()
                t.column("origin", .text).notNull()
                t.column("summary", .text).notNull()
                t.column("delta", .blob)
            }
        }
        migrator.registerMigration("2026-11-23 v2: incarnations") { db in
            // What the store file is bound to (machine and file identity); a copy or a restore
            // breaks the binding and the store continues under a new replica ID.
            try db.alter(table: ReplicaRow.databaseTableName) { t in t.add(column: "binding", .text) }
            try db.create(table: "incarnation") { t in
                t.column("replicaID", .text).primaryKey()
                t.column("startedAt", .integer).notNull()
                t.column("reason", .text).notNull()
            }
        }
        migrator.registerMigration("2026-11-23 v3: group membership") { db in
            // The sync group this replica belongs to (16 bytes), and while it is joining: the
            // inviter's device ID and the signed entry it presents.
            try db.alter(table: ReplicaRow.databaseTableName) { t in
                t.add(column: "groupID", .blob)
                t.add(column: "joinInviter", .blob)
                t.add(column: "joinEntry", .blob)
            }
        }
        // An app marks conflicts it has shown or settled; the flag is local, like the log.
        migrator.registerMigration("2026-11-24 v4: conflict.resolved") { db in
            try db.alter(table: ConflictRow.databaseTableName) { t in
                t.add(column: "resolved", .boolean).notNull().defaults(to: false)
            }
        }
        // Compaction at causal stability (issue 13): what every replica has seen (the gossip's
        // reports, with the wall-clock time each last grew, for "held back by NAME, last seen
        // N days ago"), and the frontier: the stable context P (a loaded state is purged with
        // it, so echoes of purged records are dropped) and the candidate waiting for its second
        // round. `auto_vacuum` cannot change inside a migration's transaction: an existing
        // store switches to INCREMENTAL with a one-time VACUUM on its first compaction that
        // purges something (ReplicaStore+Compaction.swift); new stores are created with it.
        migrator.registerMigration("2026-11-25 v5: seen, compaction") { db in
            try db.create(table: "seen", options: .withoutRowID) { t in
                t.column("replicaID", .blob).primaryKey()
                t.column("context", .blob).notNull()
                t.column("reportedAt", .integer).notNull()
            }
            try db.create(table: "compaction") { t in
                t.column("singleton", .integer).primaryKey().check { $0 == 1 }
                t.column("stable", .blob).notNull()
                t.column("candidate", .blob)
                t.column("purgedRecords", .integer).notNull().defaults(to: 0)
                t.column("lastRunAt", .integer)
            }
        }
        // Signed compaction reports (issue 32) and restores (issue 29). A report counts only if
        // the device that claims its replica signed it: the unsigned reports of v5 are dropped
        // (compaction waits until every device has signed one). `ownReport`: the last report
        // this store signed for each of its incarnations — one in circulation that it did not
        // sign was signed by its lost future (the store was put back from a backup).
        // `journal.events`: the dots of a local commit's own events, kept when compaction drops
        // the delta, so the writes made since a restore can be told from older ones by time.
        migrator.registerMigration("2026-11-27 v6: signed reports, own reports, journal events") { db in
            try db.drop(table: "seen")
            try db.create(table: "seen", options: .withoutRowID) { t in
                t.column("replicaID", .blob).primaryKey()
                t.column("report", .blob).notNull()
            }
            try db.create(table: "ownReport", options: .withoutRowID) { t in
                t.column("replicaID", .blob).primaryKey()
                t.column("report", .blob).notNull()
            }
            try db.alter(table: JournalRow.databaseTableName) { t in t.add(column: "events", .blob) }
            // The newest report of a lost future this store recovered from, per replica ID.
            try db.create(table: "lostFuture", options: .withoutRowID) { t in
                t.column("replicaID", .blob).primaryKey()
                t.column("time", .integer).notNull()
            }
        }
        // The names of a conflict's two writers, as the replica resolved them (its roster's
        // device names) the first time an app read the entry: they survive relaunches, the
        // writer's removal and a later rename (issue 31).
        migrator.registerMigration("2026-11-29 v7: conflict writer names") { db in
            try db.alter(table: ConflictRow.databaseTableName) { t in
                t.add(column: "winnerName", .text)
                t.add(column: "loserName", .text)
            }
        }
        return migrator
    }()
}
