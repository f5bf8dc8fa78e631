import Dispatch
import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
@testable import PeerSyncStore
import PeerSyncTestSupport
import Synchronization
import Testing
import ShiftSchedulerModel

/// Store writes never hold the state lock across fsync (issue 11): a write held just before its
/// flush leaves `state` readable, already showing the committed change. Nor across a large
/// remote change's transaction (issue 15): readers see the state before it meanwhile.
@Suite("Store durability", .ownThread)
struct DurabilityTests {
    @Test("while a write waits for its fsync, readers read the committed state without waiting")
    func readersDoNotWaitForFsync() throws {
        let directory = try makeTemporaryDirectory("peersync-durability")
        defer { removeTemporaryDirectory(directory) }
        let store = try ReplicaStore.create(directory: directory, name: "a")
        let atFlush = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        store.beforeFlush.withLock { $0 = { atFlush.signal(); _ = release.wait(timeout: .now() + 30) } }
        let written = DispatchSemaphore(value: 0)
        let writer = Thread {
            _ = try? store.write { try $0.save(Location(name: "held at the flush")) }
            written.signal()
        }
        writer.start()
        #expect(atFlush.wait(timeout: .now() + 30) == .success, "the write never reached its flush")
        store.beforeFlush.withLock { $0 = nil }
        let names = Self.locationNames(of: store)
        release.signal()
        #expect(names != nil, "a reader waited for the writer's fsync")
        #expect(names == ["held at the flush"])
        // The write completes, and the record is on disk for a fresh open.
        #expect(written.wait(timeout: .now() + 30) == .success)
        let reopened = try ReplicaStore.open(directory: directory)
        #expect(try reopened.state.fetchAll(Location.self).map(\.name) == ["held at the flush"])
    }

    @Test("while a large remote change commits, readers read the state before it without waiting; a local write waits and is kept")
    func largeChangeBesideReaders() throws {
        let directory = try makeTemporaryDirectory("peersync-durability")
        defer { removeTemporaryDirectory(directory) }
        let store = try ReplicaStore.create(directory: directory, name: "a")
        try store.write { try $0.save(Location(name: "before")) }
        // 100 records from another replica: at least 64, and more than 1/16 of those held.
        var source = ReplicaState(name: "b")
        for i in 0..<100 { try source.save(Location(name: "remote \(i)")) }
        #expect(ReplicaStore.largeChange(100, heldRecords: 1))
        let inside = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        store.insideTransaction.withLock { $0 = { inside.signal(); _ = release.wait(timeout: .now() + 30) } }
        let applied = DispatchSemaphore(value: 0)
        let delta = source.records
        Thread {
            _ = try? store.applyRemote(delta, from: "b")
            applied.signal()
        }.start()
        #expect(inside.wait(timeout: .now() + 30) == .success, "the change never reached its transaction")
        store.insideTransaction.withLock { $0 = nil }
        let names = Self.locationNames(of: store)
        // A local write meanwhile waits for the large change (else publishing the change's copy
        // would drop it).
        let wrote = DispatchSemaphore(value: 0)
        Thread {
            _ = try? store.write { try $0.save(Location(name: "local")) }
            wrote.signal()
        }.start()
        let wroteWhileHeld = wrote.wait(timeout: .now() + 0.5) == .success
        release.signal()
        #expect(names != nil, "a reader waited for a large change")
        #expect(names == ["before"], "a reader saw the change before it committed")
        #expect(!wroteWhileHeld, "a local write went ahead of a large change in progress")
        #expect(applied.wait(timeout: .now() + 30) == .success)
        #expect(wroteWhileHeld || wrote.wait(timeout: .now() + 30) == .success)
        let expected = Set(["before", "local"] + (0..<100).map { "remote \($0)" })
        #expect(Set(try store.state.fetchAll(Location.self).map(\.name)) == expected)
        let reopened = try ReplicaStore.open(directory: directory)
        #expect(Set(try reopened.state.fetchAll(Location.self).map(\.name)) == expected)
    }

    /// The store's location names, read on another thread with a deadline (30 s) so a reader
    /// that blocks fails the test instead of hanging it; nil if the read did not finish.
    private static func locationNames(of store: ReplicaStore) -> [String]? {
        let read = DispatchSemaphore(value: 0)
        let names = Mutex<[String]>([])
        Thread {
            names.withLock { $0 = ((try? store.state.fetchAll(Location.self)) ?? []).map(\.name) }
            read.signal()
        }.start()
        return read.wait(timeout: .now() + 30) == .success ? names.withLock { $0 } : nil
    }
}
