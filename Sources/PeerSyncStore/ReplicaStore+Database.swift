import Foundation
import GRDB
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import Synchronization

/// A store without a file of its own: in memory, or over a database the caller made.
extension ReplicaStore {
    /// A new replica held in memory only: for SwiftUI previews and tests. Nothing is written to
    /// disk (attachments excepted: see ``filesDirectory``); the replica is gone when the store
    /// is released. What needs a file is unavailable (see the type's comment).
    public static func inMemory(
        name: String, replicaID: ReplicaID = .random(),
        physicalClock: @escaping HybridLogicalClock.PhysicalClock = HybridLogicalClock.wallClock
    ) throws(StoreError) -> ReplicaStore {
        var config = Configuration()
        config.label = "PeerSync store (in memory)"
        let queue: DatabaseQueue
        do {
            queue = try DatabaseQueue(configuration: config)
        } catch {
            throw StoreError.wrap(error, path: inMemoryPath)
        }
        return try open(database: queue, name: name, replicaID: replicaID, physicalClock: physicalClock)
    }

    /// How errors name a store in memory.
    static let inMemoryPath = "in-memory store"

    /// Opens the replica in a database the caller made — an in-memory `DatabaseQueue()`, or a
    /// queue or pool on a file with a configuration of its own — and creates it there (named
    /// `name`, as `replicaID`) if the database is empty. `name` and `replicaID` are used only
    /// when creating.
    ///
    /// The store then has no file of its own (`directory` is nil), so it does not watch other
    /// processes' commits, fsync, checkpoint the WAL or check the file binding: the caller's
    /// configuration decides durability (SQLite's default `synchronous` makes each commit
    /// durable). Attachments go to `filesDirectory/attachments`; with `filesDirectory` nil, to a
    /// temporary directory removed when the store is released.
    ///
    /// - Throws: ``StoreError/cannotOpen(path:detail:)`` if the database holds tables other than
    ///   a PeerSync store's; ``StoreError/newerFormat(path:unknownMigrations:)``; other ``StoreError``s.
    public static func open(
        database writer: any DatabaseWriter, name: String, replicaID: ReplicaID = .random(), filesDirectory: String? = nil,
        physicalClock: @escaping HybridLogicalClock.PhysicalClock = HybridLogicalClock.wallClock
    ) throws(StoreError) -> ReplicaStore {
        let inMemory = writer.path == ":memory:" || writer.path.isEmpty || writer.path.contains("mode=memory")
        let path = inMemory ? inMemoryPath : writer.path
        do {
            if try !upgrade(writer, path: path) {
                let tables = try writer.read { db in
                    try Int.fetchOne(db, sql: "SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'") ?? 0
                }
                guard tables == 0 else {
                    throw StoreError.cannotOpen(path: path, detail: "the database holds tables other than a PeerSync store's; give an empty database")
                }
                try initialize(writer, name: name, replicaID: replicaID, binding: nil)
            }
        } catch {
            throw StoreError.wrap(error, path: path)
        }
        let files = filesDirectory ?? (NSTemporaryDirectory() as NSString).appendingPathComponent("peersync-files-\(UUID().uuidString)")
        return try ReplicaStore(directory: nil, path: path, pool: writer, checkpointer: WALCheckpointer(path: path),
                                filesDirectory: files, removesFilesDirectory: filesDirectory == nil, physicalClock: physicalClock)
    }
}
