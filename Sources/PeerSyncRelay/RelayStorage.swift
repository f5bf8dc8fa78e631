import Foundation
import GRDB
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncSeal

/// What a relay knows of one stored blob without reading its bytes.
package struct StoredBlobInfo: Sendable, Equatable {
    public let id: Int64
    public let kind: SealedBlob.Kind
    public let replica: ReplicaID
    public let first: UInt64
    public let last: UInt64
    public let size: Int
    /// For a snapshot: the version vector it covers.
    public let covers: [ReplicaID: UInt64]

    package init(id: Int64, blob: SealedBlob) {
        self.id = id
        kind = blob.kind
        replica = blob.replica
        first = blob.firstCounter
        last = blob.lastCounter
        size = blob.size
        covers = blob.covers
    }
}

/// One group as a relay stored it.
package struct StoredRelayGroup: Sendable {
    public let members: RelayMembers
    public let blobs: [StoredBlobInfo]
    public let envelopes: [KeyEnvelope]
    public let reports: [SeenReport]
}

/// Where a relay keeps its groups' member lists and sealed blobs. Every method is durable when
/// it returns (a device is told "stored" only after). The relay logic needs nothing else, so a
/// hosted relay can move to a database server by implementing this protocol (docs/RELAY.md).
package protocol RelayStorage: Sendable {
    /// Every group with its member list and blobs (at start).
    func load() throws -> [StoredRelayGroup]
    /// Saves `members` as its group's member list (creating the group).
    func saveMembers(_ members: RelayMembers) throws
    /// Stores key envelopes (ignoring those held already).
    func saveEnvelopes(_ envelopes: [KeyEnvelope]) throws
    /// Stores compaction reports, each replacing the one its device signed for its replica.
    func saveReports(_ reports: [SeenReport], group: GroupID) throws
    /// Forgets a group and everything stored for it.
    func deleteGroup(_ group: GroupID) throws
    /// Stores `blob`, deleting the blobs `dropping` (a snapshot replaces what it covers), in
    /// one transaction; returns the new blob's ID.
    func insert(_ blob: SealedBlob, dropping: [Int64]) throws -> Int64
    /// The bytes of the blobs `ids` (missing ones left out).
    func bytes(of ids: [Int64]) throws -> [Int64: [UInt8]]
    /// Bytes the storage holds for the group (blob bytes; what quotas count).
    func storedBytes(of group: GroupID) throws -> Int
}

/// ``RelayStorage`` in one SQLite file through GRDB (WAL; a commit survives a killed process).
package final class SQLiteRelayStorage: RelayStorage {
    private let database: DatabaseQueue

    /// Opens (creating if needed) the relay's database at `path`.
    public init(path: String) throws {
        var configuration = Configuration()
        configuration.label = "PeerSync relay"
        database = try DatabaseQueue(path: path, configuration: configuration)
        try database.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA journal_mode = WAL") }
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(sql: """
                CREATE TABLE groups (id BLOB PRIMARY KEY NOT NULL, members BLOB NOT NULL);
                CREATE TABLE blobs (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    groupID BLOB NOT NULL REFERENCES groups(id) ON DELETE CASCADE,
                    kind INTEGER NOT NULL, replica BLOB NOT NULL, first INTEGER NOT NULL, last INTEGER NOT NULL,
                    size INTEGER NOT NULL, data BLOB NOT NULL);
                CREATE INDEX blobs_by_group ON blobs(groupID, replica, first);
                CREATE TABLE envelopes (
                    groupID BLOB NOT NULL REFERENCES groups(id) ON DELETE CASCADE,
                    bytes BLOB NOT NULL, PRIMARY KEY (groupID, bytes));
                CREATE TABLE reports (
                    groupID BLOB NOT NULL REFERENCES groups(id) ON DELETE CASCADE,
                    device BLOB NOT NULL, replica BLOB NOT NULL, bytes BLOB NOT NULL, PRIMARY KEY (groupID, device, replica));
                """)
        }
        try migrator.migrate(database)
    }

    public func load() throws -> [StoredRelayGroup] {
        try database.read { db in
            try Row.fetchAll(db, sql: "SELECT id, members FROM groups").map { row in
                let members = try RelayMembers(bytes: [UInt8](row["members"] as Data))
                let blobs = try Row.fetchAll(db, sql: "SELECT id, data FROM blobs WHERE groupID = ? ORDER BY id",
                                             arguments: [row["id"] as Data]).map { blob in
                    StoredBlobInfo(id: blob["id"], blob: try SealedBlob(bytes: [UInt8](blob["data"] as Data)))
                }
                let envelopes = try Data.fetchAll(db, sql: "SELECT bytes FROM envelopes WHERE groupID = ?", arguments: [row["id"] as Data])
                    .map { try KeyEnvelope(bytes: [UInt8]($0)) }
                let reports = try Data.fetchAll(db, sql: "SELECT bytes FROM reports WHERE groupID = ?", arguments: [row["id"] as Data])
                    .map { try SeenReport(bytes: [UInt8]($0)) }
                return StoredRelayGroup(members: members, blobs: blobs, envelopes: envelopes, reports: reports)
            }
        }
    }

    public func saveMembers(_ members: RelayMembers) throws {
        try database.write { db in
            try db.execute(sql: "INSERT INTO groups (id, members) VALUES (?, ?) ON CONFLICT(id) DO UPDATE SET members = excluded.members",
                           arguments: [Data(members.groupID.bytes), Data(members.bytes)])
        }
    }

    public func saveEnvelopes(_ envelopes: [KeyEnvelope]) throws {
        try database.write { db in
            for envelope in envelopes {
                try db.execute(sql: "INSERT OR IGNORE INTO envelopes (groupID, bytes) VALUES (?, ?)",
                               arguments: [Data(envelope.groupID.bytes), Data(envelope.bytes)])
            }
        }
    }

    public func saveReports(_ reports: [SeenReport], group: GroupID) throws {
        try database.write { db in
            for report in reports {
                try db.execute(sql: """
                    INSERT INTO reports (groupID, device, replica, bytes) VALUES (?, ?, ?, ?)
                    ON CONFLICT(groupID, device, replica) DO UPDATE SET bytes = excluded.bytes
                    """, arguments: [Data(group.bytes), Data(report.device), Data(report.replica.bigEndianBytes), Data(report.bytes)])
            }
        }
    }

    public func deleteGroup(_ group: GroupID) throws {
        try database.write { db in
            try db.execute(sql: "DELETE FROM reports WHERE groupID = ?", arguments: [Data(group.bytes)])
            try db.execute(sql: "DELETE FROM envelopes WHERE groupID = ?", arguments: [Data(group.bytes)])
            try db.execute(sql: "DELETE FROM blobs WHERE groupID = ?", arguments: [Data(group.bytes)])
            try db.execute(sql: "DELETE FROM groups WHERE id = ?", arguments: [Data(group.bytes)])
        }
    }

    public func insert(_ blob: SealedBlob, dropping: [Int64]) throws -> Int64 {
        try database.write { db in
            for chunk in stride(from: 0, to: dropping.count, by: 500) {
                let ids = dropping[chunk..<min(chunk + 500, dropping.count)]
                try db.execute(sql: "DELETE FROM blobs WHERE id IN (\(ids.map { _ in "?" }.joined(separator: ",")))",
                               arguments: StatementArguments(Array(ids)))
            }
            try db.execute(sql: "INSERT INTO blobs (groupID, kind, replica, first, last, size, data) VALUES (?, ?, ?, ?, ?, ?, ?)",
                           arguments: [Data(blob.groupID.bytes), Int(blob.kind.rawValue), Data(blob.replica.bigEndianBytes),
                                       Int64(blob.firstCounter), Int64(blob.lastCounter), blob.size, Data(blob.bytes)])
            return db.lastInsertedRowID
        }
    }

    public func bytes(of ids: [Int64]) throws -> [Int64: [UInt8]] {
        try database.read { db in
            var found: [Int64: [UInt8]] = [:]
            for chunk in stride(from: 0, to: ids.count, by: 500) {
                let part = ids[chunk..<min(chunk + 500, ids.count)]
                for row in try Row.fetchAll(db, sql: "SELECT id, data FROM blobs WHERE id IN (\(part.map { _ in "?" }.joined(separator: ",")))",
                                            arguments: StatementArguments(Array(part))) {
                    found[row["id"]] = [UInt8](row["data"] as Data)
                }
            }
            return found
        }
    }

    public func storedBytes(of group: GroupID) throws -> Int {
        try database.read { db in
            try Int.fetchOne(db, sql: "SELECT COALESCE(SUM(size), 0) FROM blobs WHERE groupID = ?", arguments: [Data(group.bytes)]) ?? 0
        }
    }
}
