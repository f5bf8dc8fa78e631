import Foundation
import ShiftSchedulerModel
import GRDB
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import PeerSyncStore
import PeerSyncTestSupport
import Testing

/// Stores without a file of their own: in memory, or over a database the caller made.
@Suite("In-memory store")
struct InMemoryStoreTests {
    let locations = "locations"

    @Test("commits, reads back, applies remote deltas and reports conflicts, with no file")
    func commitsAndReadsBack() throws {
        let queue = try DatabaseQueue()
        let store = try ReplicaStore.open(database: queue, name: "memory")
        #expect(store.directory == nil && store.bytesOnDisk() == 0)
        let file = try queue.read { db in try Row.fetchAll(db, sql: "PRAGMA database_list").map { $0["file"] as String? } }
        #expect(file == [""], "SQLite holds the database in memory")

        let id = UUID()
        let key = RecordKey(collection: locations, id: id)
        try store.write { $0.upsert(["name": .string("Ward 3")], to: key) }
        try store.write { $0.setSetting("weekStart", to: .int(1), scope: .synced) }
        #expect(store.state.contains(key))
        #expect(try store.visibleCounts()[locations] == 1)  // (the synced setting is a record of its own collection)
        #expect(try store.journal().count == 2)

        // A peer's concurrent edit of the same field: joined, and a conflict recorded.
        var remote = ReplicaState(replicaID: testReplica(9), name: "remote")
        let edit = remote.upsert(["name": .string("Ward 4"), "floor": .int(2)], to: key)
        let delta = try #require(edit)
        let outcome = try store.applyRemote(delta, from: "peer:test")
        #expect(!outcome.isEmpty)
        #expect(store.state.context.includes(delta.context))
        #expect(try store.conflicts().count == 1)
        // The same delta again changes nothing.
        #expect(try store.applyRemote(delta, from: "peer:test").isEmpty)

        // What was committed is in the database, not only in the store's state: a second store
        // over the same connection reads it back.
        let reopened = try ReplicaStore.open(database: queue, name: "ignored")
        #expect(reopened.replicaID == store.replicaID && reopened.state.name == "memory")
        #expect(reopened.state.digest == store.state.digest)
        #expect(reopened.state.setting("weekStart", scope: .synced) == .int(1))
        #expect(try reopened.conflicts().count == 1)
    }

    @Test("commits reach the commit feed (live queries) at once")
    func commitFeed() async throws {
        let store = try ReplicaStore.inMemory(name: "feed")
        let subscription = store.commits.subscribe(CommitInterest(collections: [locations], origins: true))
        let key = RecordKey(collection: locations, id: UUID())
        try store.write { $0.upsert(["name": .string("Ward 3")], to: key) }
        #expect(await subscription.waitForChanges())
        var pending = subscription.drain()
        #expect(pending.keys == [key] && pending.byOrigin[.local] == [key])

        var remote = ReplicaState(replicaID: testReplica(9), name: "remote")
        let other = RecordKey(collection: locations, id: UUID())
        let edit = remote.upsert(["name": .string("Ward 5")], to: other)
        let unwrapped = try #require(edit)
        try store.applyRemote([unwrapped], from: "peer:test",
                              origins: [.peer(name: "remote", replicaID: testReplica(9))])
        #expect(await subscription.waitForChanges())
        pending = subscription.drain()
        #expect(pending.keys == [other])
        subscription.cancel()
    }

    @Test("watches no other process: refresh reports nothing, external changes end at once")
    func noOtherProcesses() async throws {
        let store = try ReplicaStore.inMemory(name: "alone")
        try store.write { $0.upsert(["name": .string("x")], to: RecordKey(collection: locations, id: UUID())) }
        #expect(try store.refresh().isEmpty)
        var count = 0
        for try await _ in store.externalChanges() { count += 1 }
        #expect(count == 0)
        // Compaction's space return and a new incarnation work without a file.
        try store.returnFreeSpace()
        let change = try store.beginNewIncarnation(reason: "test")
        #expect(store.replicaID == change.current && change.previous != change.current)
        #expect(try store.incarnations().count == 2)
    }

    @Test("attachments go to a temporary directory removed with the store")
    func filesDirectoryRemoved() throws {
        var files = ""
        do {
            let store = try ReplicaStore.inMemory(name: "files")
            files = store.filesDirectory
            #expect(!FileManager.default.fileExists(atPath: files), "made only when first written")
            let attachments = AttachmentStore(storeDirectory: store.filesDirectory)
            let attachment = try attachments.add(Data("bytes".utf8), mediaType: "text/plain", maxBytes: 100)
            #expect(attachments.contains(attachment.contentHash))
            #expect(files.hasPrefix(FileManager.default.temporaryDirectory.path) || files.hasPrefix(NSTemporaryDirectory()))
        }
        #expect(!FileManager.default.fileExists(atPath: files), "removed when the store was released")
    }

    @Test("a caller's database holding other tables is refused with one clear line")
    func refusesOtherDatabases() throws {
        let queue = try DatabaseQueue()
        try queue.write { db in try db.execute(sql: "CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)") }
        let error = #expect(throws: StoreError.self) { try ReplicaStore.open(database: queue, name: "x") }
        #expect(error == .cannotOpen(path: "in-memory store",
                                     detail: "the database holds tables other than a PeerSync store's; give an empty database"))
        #expect(error.map { !"\($0)".contains("\n") } == true)
        // A writer on a file, given a files directory: works like any other, and is not touched by the store otherwise.
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        let pool = try DatabasePool(path: dir + "/own.sqlite")
        let store = try ReplicaStore.open(database: pool, name: "own", filesDirectory: dir)
        try store.write { $0.upsert(["name": .string("x")], to: RecordKey(collection: locations, id: UUID())) }
        #expect(store.path == dir + "/own.sqlite" && store.filesDirectory == dir && store.directory == nil)
        #expect(try ReplicaStore.open(database: pool, name: "again").state.digest == store.state.digest)
    }
}
