import Foundation
import PeerSync
import PeerSyncTestSupport
import Testing
import ShiftSchedulerModel

/// Real sockets on 127.0.0.1, real TLS (pre-shared key from the group secret), real stores.
@Suite("Sync sessions", .serialized, .awaitsCleanups)
struct SyncTests {
    let group = TestGroup()

    func randomEdits(_ replica: TestReplica, count: Int, seed: UInt64, ids: [UUID]) async throws {
        var rng = SeededGenerator(seed: seed)
        for i in 0..<count {
            let id = ids.randomElement(using: &rng)!
            let key = RecordKey(collection: ShiftType.collection, id: id)
            switch Int.random(in: 0..<10, using: &rng) {
            case 0: try await replica.write { $0.delete(key) }
            case 1: try await replica.write { $0.setSetting("weekStart", to: .int(Int64(i % 7)), scope: .synced) }
            default:
                try await replica.write { state in
                    state.upsert(["title": .string("\(replica.name) \(i)"), "duration": .int(Int64(i))], to: key)
                }
            }
        }
    }

    @Test("two replicas editing concurrently while connected converge")
    func twoReplicas() async throws {
        let a = try TestReplica("a", in: group)
        let b = try TestReplica("b", in: group)
        defer { afterTest { await a.shutdown(); await b.shutdown() } }
        try await a.start()
        try await b.start()
        await b.node.addPeer(.loopback(a.port))
        #expect(await eventually {
            let (pa, pb) = (await a.node.peers(), await b.node.peers())
            return !pa.isEmpty && !pb.isEmpty
        })
        let ids = (0..<30).map { _ in UUID() }
        async let editsA: Void = randomEdits(a, count: 200, seed: baseSeed, ids: ids)
        async let editsB: Void = randomEdits(b, count: 200, seed: baseSeed &+ 1, ids: ids)
        _ = try await (editsA, editsB)
        #expect(await eventually { allConverged([a, b]) })
        #expect(a.store.state.records == b.store.state.records)
        #expect(a.store.state.records.recordCount > 0)
    }

    @Test("five replicas in a mesh editing concurrently converge")
    func fiveReplicas() async throws {
        var replicas: [TestReplica] = []
        for i in 0..<5 { replicas.append(try TestReplica("r\(i)", in: group)) }
        defer { let all = replicas; afterTest { for r in all { await r.shutdown() } } }
        for r in replicas { try await r.start() }
        for (i, r) in replicas.enumerated() {
            for other in replicas[..<i] { await r.node.addPeer(.loopback(other.port)) }
        }
        #expect(await eventually {
            for r in replicas where await r.node.peers().count < 4 { return false }
            return true
        })
        let ids = (0..<40).map { _ in UUID() }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (i, r) in replicas.enumerated() {
                group.addTask { try await randomEdits(r, count: 80, seed: baseSeed &+ UInt64(i), ids: ids) }
            }
            try await group.waitForAll()
        }
        #expect(await eventually { allConverged(replicas) })
        // Only one connection per pair survives, whoever dialed.
        for r in replicas { #expect(await r.node.peers().count == 4) }
    }

    @Test("a replica that was offline gets only what it missed")
    func reconnectSendsOnlyTheMissingPart() async throws {
        let a = try TestReplica("a", in: group)
        let b = try TestReplica("b", in: group)
        defer { afterTest { await a.shutdown(); await b.shutdown() } }
        // A holds 2,000 records; B receives the full state on first contact.
        try a.store.write { state in
            (0..<2_000).map { i in
                state.write(["symbol": .string("S\(i % 10)"), "title": .string("Shift type number \(i)"),
                             "duration": .int(28_800), "description": .string("Imported shift type \(i) for the reconnect test")],
                            to: RecordKey(collection: ShiftType.collection, id: UUID()))
            }.reduce(RecordMap()) { $0.merged(with: $1) }
        }
        try await a.start()
        try await b.start()
        await b.node.addPeer(.loopback(a.port))
        #expect(await eventually { allConverged([a, b]) })
        let fullStateBytes = await b.node.traffic().bytesReceived
        let chunkType: UInt8 = 2  // chunk (docs/PROTOCOL.md §3)
        let fullStateChunkBytes = await a.node.traffic().frameBytesSentByType[chunkType] ?? 0
        // B goes offline; both sides edit.
        await b.node.stop()
        let ids = Array(a.store.state.records.records(in: ShiftType.collection).keys.prefix(40))
        for id in ids.prefix(20) {
            try a.store.write { $0.upsert(["title": .string("changed on A")], to: RecordKey(collection: ShiftType.collection, id: id)) }
        }
        for id in ids.suffix(20) {
            try b.store.write { $0.upsert(["title": .string("changed on B")], to: RecordKey(collection: ShiftType.collection, id: id)) }
        }
        #expect(!allConverged([a, b]))
        // B comes back (a new node on the same store) and reconnects.
        try await b.restartNode()
        try await b.start()
        await b.node.addPeer(.loopback(a.port))
        #expect(await eventually { allConverged([a, b]) })
        let reconnectBytes = await b.node.traffic().bytesReceived
        let reconnectChunkBytes = (await a.node.traffic().frameBytesSentByType[chunkType] ?? 0) - fullStateChunkBytes
        print("reconnect: \(reconnectBytes) bytes received vs \(fullStateBytes) for the full state; chunks \(reconnectChunkBytes) vs \(fullStateChunkBytes)")
        // The catch-up carries the 20 changed records of 2,000; the whole exchange also carries
        // the fixed cost of a session (TLS handshake, hellos), about as much as the full
        // state's deflated chunks take per 100 records.
        #expect(reconnectChunkBytes * 20 < fullStateChunkBytes, "reconnect's chunks took \(reconnectChunkBytes) bytes, the full state's \(fullStateChunkBytes)")
        #expect(reconnectBytes * 10 < fullStateBytes, "reconnect took \(reconnectBytes) bytes, full state \(fullStateBytes)")
        #expect(try a.store.state.fetchAll(ShiftType.self).filter { $0.title == "changed on B" }.count == 20)
    }

    @Test("chain A–B–C without an A–C link: an edit on A reaches C")
    func chain() async throws {
        let a = try TestReplica("a", in: group)
        let b = try TestReplica("b", in: group)
        let c = try TestReplica("c", in: group)
        defer { afterTest { await a.shutdown(); await b.shutdown(); await c.shutdown() } }
        try await a.start()
        try await b.start()
        try await c.start()
        await a.node.addPeer(.loopback(b.port))
        await c.node.addPeer(.loopback(b.port))
        #expect(await eventually { await b.node.peers().count == 2 })
        let location = Location(name: "Only on A")
        try await a.write { try $0.save(location) }
        #expect(await eventually { c.store.state.contains(location.recordKey) })
        #expect(await a.node.peers().map(\.info.replicaID) == [b.store.replicaID])
        #expect(await c.node.peers().map(\.info.replicaID) == [b.store.replicaID])
        #expect(await eventually { allConverged([a, b, c]) })
    }

    @Test("a device of another group is refused with a clear reason and no record crosses either way")
    func wrongSecret() async throws {
        let a = try TestReplica("a", in: group)
        let stranger = try TestReplica("stranger", in: TestGroup())
        defer { afterTest { await a.shutdown(); await stranger.shutdown() } }
        try await a.write { try $0.save(Location(name: "secret of A")) }
        try await stranger.write { try $0.save(Location(name: "secret of the stranger")) }
        let digests = (a.digest, stranger.digest)
        try await a.start()
        let events = stranger.node.events()
        await stranger.node.addPeer(.loopback(a.port))
        var refusal: String?
        for await event in events {
            if case .sessionRefused(_, let reason) = event { refusal = reason.description; break }
        }
        #expect(refusal?.contains("another sync group") == true, "\(refusal ?? "no refusal")")
        let (peersA, peersStranger) = (await a.node.peers(), await stranger.node.peers())
        #expect(peersA.isEmpty && peersStranger.isEmpty)
        #expect((a.digest, stranger.digest) == digests)
        #expect(try a.store.state.fetchAll(Location.self).map(\.name) == ["secret of A"])
        #expect(try stranger.store.state.fetchAll(Location.self).map(\.name) == ["secret of the stranger"])
    }

    @Test("a peer whose clock is an hour ahead is refused, naming the offset; one within the bound syncs")
    func clockSkew() async throws {
        let a = try TestReplica("a", in: group)
        let ahead = try TestReplica("ahead", in: group, wallClock: { HybridLogicalClock.wallClock() + 3_600_000 })
        let close = try TestReplica("close", in: group, wallClock: { HybridLogicalClock.wallClock() + 60_000 })
        defer { afterTest { await a.shutdown(); await ahead.shutdown(); await close.shutdown() } }
        try await a.start()
        let events = ahead.node.events()
        await ahead.node.addPeer(.loopback(a.port))
        var refusal: String?
        for await event in events {
            if case .sessionRefused(_, let reason) = event { refusal = reason.description; break }
        }
        #expect(refusal?.contains("clock offset 1 h 0 min") == true, "\(refusal ?? "none")")
        try await close.write { try $0.save(Location(name: "from a minute ahead")) }
        await close.node.addPeer(.loopback(a.port))
        #expect(await eventually { allConverged([a, close]) })
    }
}
