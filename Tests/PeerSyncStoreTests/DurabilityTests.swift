import Dispatch
import Foundation
import PeerSyncCRDT
import PeerSyncModel
@testable import PeerSyncStore
import PeerSyncTestSupport
import Synchronization
import Testing

/// Store writes never hold the state lock across fsync (issue 11): a write held just before its
/// flush leaves `state` readable, already showing the committed change.
@Suite("Store durability")
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
        // Read on another thread with a deadline, so a reader that blocks fails instead of hanging.
        let read = DispatchSemaphore(value: 0)
        let names = Mutex<[String]>([])
        Thread {
            names.withLock { $0 = ((try? store.state.fetchAll(Location.self)) ?? []).map(\.name) }
            read.signal()
        }.start()
        let readInTime = read.wait(timeout: .now() + 30) == .success
        release.signal()
        #expect(readInTime, "a reader waited for the writer's fsync")
        #expect(names.withLock { $0 } == ["held at the flush"])
        // The write completes, and the record is on disk for a fresh open.
        #expect(written.wait(timeout: .now() + 30) == .success)
        let reopened = try ReplicaStore.open(directory: directory)
        #expect(try reopened.state.fetchAll(Location.self).map(\.name) == ["held at the flush"])
    }
}
