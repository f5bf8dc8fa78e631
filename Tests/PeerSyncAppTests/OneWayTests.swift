import Foundation
import ShiftSchedulerModel
@testable import PeerSync
import PeerSyncAppTestSupport
import PeerSyncTestSupport
import Synchronization
import Testing

/// One way in, one way out (issue 30): every commit to a replica's store reaches every peer,
/// over TCP and over an app's own transport, from one place (the replicator follows the store's
/// commit feed); `changes()` never drops a change, and control events are acted on under load.
@Suite("One way in, one way out", .timeLimit(.minutes(10)))
struct OneWayTests {
    /// How two replicas are linked.
    enum Transport: String, CaseIterable, CustomTestStringConvertible, Sendable {
        /// TLS over 127.0.0.1 (SyncNode).
        case tcp
        /// The app-transport session API over an in-memory pipe (no SyncNode at all).
        case pipe
        var testDescription: String { rawValue }
    }

    /// Timers under which only live deltas carry a change: no digest round (which would also
    /// reveal a change that was never shipped) for the length of a test.
    static let liveOnly: SyncTiming = {
        var timing = SyncTiming()
        timing.digestQuietPeriod = .seconds(3_600)
        timing.keepaliveInterval = .seconds(1)
        timing.deadPeerTimeout = .seconds(600)
        return timing
    }()

    /// Links replicas to a hub over one kind of transport.
    final class Links: @unchecked Sendable {  // used by one test task only
        let transport: Transport
        let timing: SyncTiming
        private var port: UInt16 = 0
        private var pipes: [PipeLink] = []

        init(_ transport: Transport, timing: SyncTiming = OneWayTests.liveOnly) {
            self.transport = transport
            self.timing = timing
        }

        /// Turns sync on at the hub: listening on loopback (TCP) or with no TCP at all (pipe).
        func start(hub: Replica) async throws {
            switch transport {
            case .tcp:
                port = try await hub.startSync(SyncConfiguration(security: .tls, listen: .loopback(0), timing: timing))
            case .pipe:
                try await hub.startSync(SyncConfiguration(security: .insecure, listen: nil, timing: timing))
            }
        }

        /// Links `other` to the hub and waits until the session is established on both sides.
        func attach(_ other: Replica, to hub: Replica) async throws {
            switch transport {
            case .tcp:
                try await other.startSync(SyncConfiguration(security: .tls, listen: nil, peers: [.loopback(port)], timing: timing))
            case .pipe:
                try await other.startSync(SyncConfiguration(security: .insecure, listen: nil, timing: timing))
                pipes.append(PipeLink(hub, other))
            }
            let linked = await eventually {
                let (fromHub, fromOther) = (await hub.peers(), await other.peers())
                return fromHub.contains { $0.info.replicaID == other.replicaID } && fromOther.contains { $0.info.replicaID == hub.replicaID }
            }
            try #require(linked, "\(transport): the replicas did not link")
        }

        func close() async {
            for pipe in pipes { await pipe.close() }
        }
    }

    @Test("a batch made while syncing only over an in-memory app transport reaches the peer live")
    func batchOverAppTransport() async throws {
        let a = try TestApp("batch-a")
        let b = try TestApp("batch-b")
        defer { Task { await a.close(); await b.close() } }
        let links = Links(.pipe)
        try await links.start(hub: a.replica)
        try await links.attach(b.replica, to: a.replica)
        #expect(await a.replica.currentNode == nil)  // no TCP node: only the app's transport

        let imported = (0..<20).map { Location(name: "imported \($0)") }
        try await a.replica.batch { batch in
            for location in imported { try batch.save(location) }
        }
        // No digest round runs (liveOnly): only the batch's live delta can bring them.
        #expect(try await eventually { try b.replica.fetchAll(Location.self).count == imported.count })
        await links.close()
    }

    @Test("every public write entry reaches a peer", arguments: Transport.allCases)
    func everyWriteReachesPeers(_ transport: Transport) async throws {
        let directories = try (0..<5).map { _ in try makeTemporaryDirectory("peersync-oneway") }
        defer { directories.forEach(removeTemporaryDirectory) }
        let logger = testLogger("oneway")
        let a = try Replica.create(at: directories[0], name: "a", logger: logger)
        let b = try Replica.join(at: directories[1], name: "b", invite: try await a.invite(), logger: logger)
        let links = Links(transport)
        let existing = Location(name: "to delete")
        try await a.save(existing)
        try await links.start(hub: a)
        try await links.attach(b, to: a)
        #expect(try await eventually { try b.fetch(Location.self, id: existing.id) != nil })  // the catch-up

        // save, delete, a synced setting, commit, batch, the store's own write.
        let saved = Location(name: "saved")
        try await a.save(saved)
        try await a.delete(Location.self, id: existing.id)
        try await a.setSetting("weekStart", to: 3, scope: .synced)
        let committed = Location(name: "committed")
        try await a.commit { try $0.save(committed) }
        let batched = Location(name: "batched")
        try await a.batch { try $0.save(batched) }
        let written = Location(name: "store.write")
        try a.store.write { try $0.save(written) }
        #expect(try await eventually {
            try b.fetch(Location.self, id: saved.id) != nil && b.fetch(Location.self, id: existing.id) == nil
                && b.setting("weekStart", scope: .synced) == 3 && b.fetch(Location.self, id: committed.id) != nil
                && b.fetch(Location.self, id: batched.id) != nil && b.fetch(Location.self, id: written.id) != nil
        })

        // An admission: a admits d over the same kind of transport; b learns of d live.
        let d = try Replica.join(at: directories[3], name: "d", invite: try await a.invite(), logger: logger)
        try await links.attach(d, to: a)
        #expect(await eventually { b.roster().isActive(d.deviceID) })
        #expect(await eventually { await d.pendingJoin == nil })  // d itself knows it joined (it bundles for members)

        // An import: d goes offline, writes, and sends a a bundle; b gets what a imported.
        await d.stopSync()
        let fromBundle = Location(name: "carried by bundle")
        try await d.save(fromBundle)
        try await a.applyBundle(d.makeBundle(for: nil))
        #expect(try await eventually { try b.fetch(Location.self, id: fromBundle.id) != nil })

        // Another process's commit on a's store.
        let other = try ReplicaStore.open(directory: directories[0])
        let fromOtherProcess = Location(name: "other process")
        try other.write { try $0.save(fromOtherProcess) }
        #expect(try await eventually { try b.fetch(Location.self, id: fromOtherProcess.id) != nil })
        await links.close()
        await a.stopSync()
        await b.stopSync()
    }

    @Test("a changes() reader that sleeps while 10,000 commits land receives every changed record")
    func changesNeverDrop() async throws {
        let app = try TestApp("lossless")
        defer { Task { await app.close() } }
        let changes = app.replica.changes()
        var iterator = changes.makeAsyncIterator()
        let store = app.replica.store
        let written = try await offPool {
            var written: Set<RecordKey> = []
            for i in 0..<10_000 {
                let location = Location(name: "commit \(i)")
                try store.write { try $0.save(location) }
                written.insert(location.recordKey)
            }
            return written
        }
        // Only now does the reader wake up: everything is still there, coalesced.
        var received: Set<RecordKey> = []
        var elements = 0
        while !written.isSubset(of: received), elements < 10_000 {
            let change = try #require(await iterator.next())
            #expect(change.origin == .local)
            received.formUnion(change.records)
            elements += 1
        }
        #expect(written.isSubset(of: received))
        #expect(elements < 10)  // coalesced: a handful of elements, not one per commit
    }

    @Test("a control event is acted on while 10,000 commits stream to the replica", arguments: Transport.allCases)
    func controlEventUnderLoad(_ transport: Transport) async throws {
        let directories = try (0..<2).map { _ in try makeTemporaryDirectory("peersync-control") }
        defer { directories.forEach(removeTemporaryDirectory) }
        let logger = testLogger("control")
        let a = try Replica.create(at: directories[0], name: "a", logger: logger)
        let b = try Replica.join(at: directories[1], name: "b", invite: try await a.invite(), logger: logger)
        var timing = SyncTiming()
        timing.deadPeerTimeout = .seconds(600)
        let links = Links(transport, timing: timing)
        try await links.start(hub: a)
        try await links.attach(b, to: a)
        let slowReader = b.changes()  // a reader that never reads
        let store = a.store
        let flood: @Sendable (Range<Int>) throws -> Void = { range in
            for i in range { try store.write { try $0.save(Location(name: "flood \(i)")) } }
        }
        try await offPool { try flood(0..<5_000) }
        try await a.removeDevice(b.deviceID)
        try await offPool { try flood(5_000..<10_000) }
        // b acts on its removal (the session refused with reason 13, or the entry itself) — once
        // it has committed what came before the refusal (minutes on a loaded 2-core machine).
        #expect(await eventually(timeout: .seconds(600)) {
            if case .error(.removedFromGroup) = await b.currentStatus { return true }
            return false
        })
        _ = slowReader
        await links.close()
        await a.stopSync()
        await b.stopSync()
    }
}

/// Runs `body` on a thread of its own: a loop of thousands of synchronous commits (each an
/// fsync) must not hold a thread of the cooperative pool, which every other task needs.
func offPool<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread { continuation.resume(with: Result { try body() }) }
    }
}
