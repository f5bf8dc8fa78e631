import Foundation
import PeerSync
import PeerSyncAppTestSupport
@testable import PeerSyncStore
import PeerSyncTestSupport
import Synchronization
import Testing
import ShiftSchedulerModel

/// Liveness on the monotonic clock, goodbyes on shutdown, and sync over an app's own transport.
@Suite("Session lifecycle", .serialized, .awaitsCleanups)
struct SessionLifecycleTests {
    let group = TestGroup()

    /// Collects the disconnections a node reports.
    final class Disconnections: Sendable {
        let reasons = Mutex<[SessionEndReason]>([])
        init(_ events: AsyncStream<NodeEvent>) {
            Task { [self] in
                for await event in events {
                    if case .peerDisconnected(_, let reason) = event { self.reasons.withLock { $0.append(reason) } }
                }
            }
        }
        var all: [SessionEndReason] { reasons.withLock { $0 } }
    }

    @Test("the wall clock steps back and forward by an hour under a live session: no crash, no dropped peer")
    func wallClockSteps() async throws {
        let offset = Atomic<Int64>(0)
        let stepped: @Sendable () -> UInt64 = {
            UInt64(bitPattern: Int64(bitPattern: HybridLogicalClock.wallClock()) &+ offset.load(ordering: .relaxed))
        }
        let a = try TestReplica("a", in: group, wallClock: stepped)
        let b = try TestReplica("b", in: group)
        defer { afterTest { await a.shutdown(); await b.shutdown() } }
        let (dropsA, dropsB) = (Disconnections(a.node.events()), Disconnections(b.node.events()))
        try await a.start()
        try await b.start()
        await b.node.addPeer(.loopback(a.port))
        #expect(await eventually {
            let (pa, pb) = (await a.node.peers(), await b.node.peers())
            return pa.count == 1 && pb.count == 1
        })

        func keepaliveRoundsPass(_ n: Int) async -> Bool {
            let start = await a.node.traffic().framesReceived
            return await eventually { await a.node.traffic().framesReceived >= start + n }
        }
        #expect(await eventually { allConverged([a, b]) })
        // Drops from here on are the clock's doing. (Before the session was up, a loaded CI
        // machine once let a first handshake outlive the 10 s timeout; the redial made it.)
        let (earlierA, earlierB) = (dropsA.all.count, dropsB.all.count)
        // An hour back: a's HLC does not go back; its writes still reach b and still win.
        offset.store(-3_600_000, ordering: .relaxed)
        #expect(await keepaliveRoundsPass(3))
        let before = try #require(a.store.state.records.maxTimestamp as HLCTimestamp?)
        try await a.write { try $0.save(Location(name: "written an hour in the past")) }
        #expect(a.store.state.records.maxTimestamp > before)
        #expect(await eventually { (try? b.store.state.fetchAll(Location.self).count) == 1 })
        // An hour forward: b's writes are in a's past and are applied.
        offset.store(3_600_000, ordering: .relaxed)
        #expect(await keepaliveRoundsPass(3))
        try await b.write { try $0.save(Location(name: "written while a is an hour ahead")) }
        #expect(await eventually { (try? a.store.state.fetchAll(Location.self).count) == 2 })
        offset.store(0, ordering: .relaxed)
        #expect(await keepaliveRoundsPass(3))
        #expect(await eventually { allConverged([a, b]) })
        #expect(dropsA.all.count == earlierA, "\(dropsA.all)")
        #expect(dropsB.all.count == earlierB, "\(dropsB.all)")
        #expect(await a.node.peers().count == 1)
    }

    @Test("stopping a node says goodbye to its peer every time (20 trials)")
    func goodbyeOnStop() async throws {
        for trial in 0..<20 {
            let pair = TestGroup(size: 2)
            let a = try TestReplica("a\(trial)", in: pair)
            let b = try TestReplica("b\(trial)", in: pair)
            let drops = Disconnections(b.node.events())
            try await a.start()
            try await b.start()
            await b.node.addPeer(.loopback(a.port))
            #expect(await eventually {
                let (pa, pb) = (await a.node.peers(), await b.node.peers())
                return pa.count == 1 && pb.count == 1
            })
            let last = Location(name: "just before stopping \(trial)")
            try await a.write { try $0.save(last) }
            await a.node.stop()
            #expect(await eventually { !drops.all.isEmpty })
            #expect(drops.all.first == .peerClosed(.shuttingDown, detail: "node shutting down"), "trial \(trial): \(drops.all)")
            // What a wrote just before stopping went out before its goodbye.
            #expect(await eventually { b.store.state.contains(last.recordKey) }, "trial \(trial)")
            await b.shutdown()
            await a.shutdown()
        }
    }

    @Test("a commit in flight when the node stops is stored before stop returns (an app may close or delete the store next)")
    func stopWaitsForCommit() async throws {
        let a = try TestReplica("a", in: group)
        let b = try TestReplica("b", in: group)
        defer { afterTest { await a.shutdown(); await b.shutdown() } }
        try await a.start()
        try await b.start()
        await b.node.addPeer(.loopback(a.port))
        #expect(await eventually { await a.node.peers().count == 1 && allConverged([a, b]) })
        // The flush of the commit that stores what a writes next waits for the test: it is then
        // written on b, not yet durable. (Only that one: b also flushes, e.g., its own signed
        // compaction report.)
        let order = Mutex<[String]>([])
        let (atFlush, release) = (DispatchSemaphore(value: 0), DispatchSemaphore(value: 0))
        let held = Atomic<Bool>(false)
        let last = Location(name: "arrives as b stops")
        let store = b.store
        b.store.beforeFlush.withLock {
            $0 = {
                guard store.state.records.record(last.recordKey) != nil, !held.exchange(true, ordering: .relaxed) else { return }
                atFlush.signal()
                _ = release.wait(timeout: .now() + 30)
                order.withLock { $0.append("stored") }
            }
        }
        try await a.write { try $0.save(last) }
        #expect(await eventually { atFlush.wait(timeout: .now()) == .success })
        let stopping = Task {
            await b.node.stop()
            order.withLock { $0.append("stopped") }
        }
        // A bounded wait for what must not happen: stop returning while the commit is held.
        let returnedEarly = await eventually(timeout: .seconds(2)) { order.withLock { $0.contains("stopped") } }
        release.signal()
        await stopping.value
        b.store.beforeFlush.withLock { $0 = nil }
        #expect(!returnedEarly)
        #expect(order.withLock { $0 } == ["stored", "stopped"])
        #expect(b.store.state.contains(last.recordKey))
    }

    @Test("two replicas converge through an in-memory pipe with the transport-independent session API")
    func inMemoryPipe() async throws {
        let directories = try (0..<2).map { _ in try makeTemporaryDirectory("peersync-pipe") }
        defer { directories.forEach(removeTemporaryDirectory) }
        let a = try Replica.create(at: directories[0], name: "a")
        let b = try Replica.join(at: directories[1], name: "b", invite: try await a.invite())
        for i in 0..<300 { try await a.save(Location(name: "from a \(i)")) }
        try await b.save(ShiftType(symbol: "N", title: "Night", duration: 36_000))
        let pipe = PipeLink(a, b)  // the sessions, their pumps, and a reconnect as an app would
        #expect(await eventually { a.state.digest == b.state.digest })
        // Live changes flow both ways.
        try await a.save(Location(name: "live from a"))
        try await b.delete(ShiftType.self, id: try #require(b.fetchAll(ShiftType.self).first).id)
        #expect(await eventually { a.state.digest == b.state.digest && (try? a.fetchAll(ShiftType.self).isEmpty) == true })
        #expect(try b.fetchAll(Location.self).count == 301)
        await pipe.close()
        await a.stopSync()
        await b.stopSync()
    }
}
