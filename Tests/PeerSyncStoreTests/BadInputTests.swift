import Foundation
import GRDB
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import PeerSyncStore
import PeerSyncTestSupport
import Testing
import ShiftSchedulerModel

/// Bad files and failing disks: one clear error naming the file and the cause, nothing half-written.
@Suite("Store errors", .ownThread)
struct BadInputTests {
    static let isRoot = getuid() == 0

    func expectStoreError(_ check: (StoreError) -> Bool, naming path: String, _ body: () throws -> Void,
                          sourceLocation: SourceLocation = #_sourceLocation) {
        do {
            try body()
            Issue.record("expected a StoreError", sourceLocation: sourceLocation)
        } catch let error as StoreError {
            #expect(check(error), "unexpected \(error)", sourceLocation: sourceLocation)
            #expect(error.description.contains(path), "message does not name \(path): \(error)", sourceLocation: sourceLocation)
            #expect(!error.description.contains("\n"), sourceLocation: sourceLocation)
        } catch {
            Issue.record("expected a StoreError, got \(error)", sourceLocation: sourceLocation)
        }
    }

    @Test("missing store and existing store")
    func missingAndExisting() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        expectStoreError({ if case .missing = $0 { true } else { false } }, naming: dir) {
            _ = try ReplicaStore.open(directory: dir)
        }
        let store = try ReplicaStore.create(directory: dir, name: "a")
        expectStoreError({ if case .alreadyExists = $0 { true } else { false } }, naming: dir) {
            _ = try ReplicaStore.create(directory: dir, name: "b")
        }
        #expect(try ReplicaStore.open(directory: dir).replicaID == store.replicaID)
    }

    @Test("a file that is not SQLite is refused and left as it was")
    func notSQLite() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        let path = ReplicaStore.path(in: dir)
        let junk = Data((0..<8192).map { UInt8(truncatingIfNeeded: $0 &* 31) })
        try junk.write(to: URL(fileURLWithPath: path))
        expectStoreError({ if case .notAStore = $0 { true } else { false } }, naming: path) {
            _ = try ReplicaStore.open(directory: dir)
        }
        expectStoreError({ if case .notAStore = $0 { true } else { false } }, naming: path) {
            _ = try ReplicaStore.create(directory: dir, name: "x")
        }
        #expect(try Data(contentsOf: URL(fileURLWithPath: path)) == junk)
    }

    @Test("an SQLite file of another program is refused, no tables added")
    func foreignSQLite() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        let path = ReplicaStore.path(in: dir)
        try DatabaseQueue(path: path).write { try $0.execute(sql: "CREATE TABLE notes(text)") }
        expectStoreError({ if case .notAStore = $0 { true } else { false } }, naming: path) {
            _ = try ReplicaStore.open(directory: dir)
        }
        let tables = try DatabaseQueue(path: path).read { try String.fetchAll($0, sql: "SELECT name FROM sqlite_master WHERE type = 'table'") }
        #expect(tables == ["notes"])
    }

    @Test("a store from a newer PeerSync is refused")
    func newerSchema() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        _ = try ReplicaStore.create(directory: dir, name: "x")
        let path = ReplicaStore.path(in: dir)
        try DatabaseQueue(path: path).write { try $0.execute(sql: "INSERT INTO grdb_migrations VALUES ('2099-01-01 v9: from the future')") }
        expectStoreError({ if case .newerFormat(_, let unknown) = $0 { unknown == ["2099-01-01 v9: from the future"] } else { false } }, naming: path) {
            _ = try ReplicaStore.open(directory: dir)
        }
    }

    @Test("a corrupted file gives a clear error, not a crash")
    func corrupted() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        let store = try ReplicaStore.create(directory: dir, name: "x")
        for i in 0..<300 { try store.write { try $0.save(Location(name: "location \(i)", address: String(repeating: "x", count: 100))) } }
        let path = ReplicaStore.path(in: dir)
        // Fold the WAL into the main file, then scribble over every page after the first.
        try DatabaseQueue(path: path).writeWithoutTransaction { try $0.execute(sql: "PRAGMA wal_checkpoint(TRUNCATE)") }
        var bytes = try Data(contentsOf: URL(fileURLWithPath: path))
        for i in stride(from: 4096 + 100, to: bytes.count, by: 512) { bytes[i] = 0xA5; bytes[i + 1] = 0x5A }
        try bytes.write(to: URL(fileURLWithPath: path))
        expectStoreError({
            switch $0 { case .corrupt, .notAStore: true; default: false }
        }, naming: path) {
            _ = try ReplicaStore.open(directory: dir)
        }
    }

    @Test("a read-only store: clear error, data intact", .enabled(if: BadInputTests.isRoot, "needs root for a read-only bind mount"))
    func readOnly() throws {
        let dir = try makeTemporaryDirectory()
        let mountPoint = try makeTemporaryDirectory("peersync-ro")
        defer { removeTemporaryDirectory(dir); removeTemporaryDirectory(mountPoint) }
        let store = try ReplicaStore.create(directory: dir, name: "x")
        try store.write { try $0.save(Location(name: "precious")) }
        let digest = store.state.digest
        try DatabaseQueue(path: ReplicaStore.path(in: dir)).writeWithoutTransaction { try $0.execute(sql: "PRAGMA wal_checkpoint(TRUNCATE)") }
        try run("/bin/mount", "--bind", dir, mountPoint)
        defer { try? run("/bin/umount", mountPoint) }
        try run("/bin/mount", "-o", "remount,ro,bind", mountPoint)
        let path = ReplicaStore.path(in: mountPoint)
        expectStoreError({
            switch $0 { case .readOnly, .cannotOpen: true; default: false }
        }, naming: path) {
            let ro = try ReplicaStore.open(directory: mountPoint)
            try ro.write { try $0.save(Location(name: "nope")) }
        }
        #expect(try ReplicaStore.open(directory: dir).state.digest == digest)
    }

    @Test("a full disk: the write fails cleanly, earlier data intact", .enabled(if: BadInputTests.isRoot, "needs root to mount a small tmpfs"))
    func diskFull() throws {
        let mountPoint = try makeTemporaryDirectory("peersync-full")
        defer { removeTemporaryDirectory(mountPoint) }
        try run("/bin/mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", mountPoint)
        defer { try? run("/bin/umount", mountPoint) }
        let dir = mountPoint + "/store"
        let store = try ReplicaStore.create(directory: dir, name: "x")
        var saved: [Location] = []
        var failure: (any Error)?
        for i in 0..<10_000 {
            let location = Location(name: "location \(i)", address: String(repeating: "a", count: 400))
            do {
                try store.write { try $0.save(location) }
                saved.append(location)
            } catch {
                failure = error
                break
            }
        }
        let error = try #require(failure as? StoreError, "the disk never filled, or the error was not a StoreError: \(String(describing: failure))")
        switch error {
        case .diskFull, .io: break
        default: Issue.record("unexpected \(error)")
        }
        #expect(error.description.contains(ReplicaStore.path(in: dir)))
        // Memory was not changed by the failed write, and every saved record is on disk.
        #expect(try store.state.fetchAll(Location.self).count == saved.count)
        let reopened = try ReplicaStore.open(directory: dir)
        #expect(Set(try reopened.state.fetchAll(Location.self).map(\.id)) == Set(saved.map(\.id)))
    }

    func run(_ tool: String, _ arguments: String...) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: tool)
        process.arguments = arguments
        try process.run()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else { throw MissingValue(description: "\(tool) \(arguments) failed") }
    }
}
