import Foundation
import PeerSync
@testable import PeerSyncSession
import PeerSyncTestSupport
@testable import PeerSyncWire
import Testing

/// The compaction gossip (`seen`, type 16) in the replication core, without sockets or clocks.
@Suite("Compaction gossip in the core")
struct GossipCoreTests {
    let t0 = ContinuousClock.now

    func seenFrames(_ frames: [WireFrame]) -> [SeenContexts] {
        frames.filter { $0.type == SeenMessage.kind }.compactMap { try? SeenMessage.decode(body: $0.body) }
    }

    /// Quiet rounds on a chain a–b–c: every node ticks after a quiet period, then the links settle.
    func rounds(_ count: Int, _ a: inout CoreNode, _ b: inout CoreNode, _ c: inout CoreNode, _ ab: inout CoreLink,
                _ bc: inout CoreLink, from start: ContinuousClock.Instant) throws -> ContinuousClock.Instant {
        var now = start
        for _ in 0..<count {
            now += .seconds(2)
            a.handle(a.core.tick(now: now))
            b.handle(b.core.tick(now: now))
            c.handle(c.core.tick(now: now))
            try ab.settle(&a, &b, now: now)
            try bc.settle(&b, &c, now: now)
        }
        return now
    }

    func seenCount(_ links: CoreLink...) -> Int {
        links.reduce(0) { $0 + seenFrames($1.framesToA).count + seenFrames($1.framesToB).count }
    }

    @Test("a learns what c has seen through b (a chain a–b–c), and an idle group then sends no more seen messages")
    func gossipTravelsAndStops() throws {
        var a = CoreNode("a", seenGossip: true)
        var b = CoreNode("b", seenGossip: true)
        var c = CoreNode("c", seenGossip: true)
        try a.write { try $0.save(Location(name: "doomed")) }
        var ab = CoreLink.connect(&a, &b, now: t0)
        try ab.settle(&a, &b, now: t0)
        var bc = CoreLink.connect(&b, &c, now: t0)
        try bc.settle(&b, &c, now: t0)
        let id = try #require(a.state.fetchAll(Location.self).first?.id)
        a.write { $0.delete(Location.self, id: id) }
        let deleted = a.state.context
        var now = try rounds(6, &a, &b, &c, &ab, &bc, from: t0)
        #expect(c.state.context.includes(deleted))
        let aKnows = try #require(a.seen?.reports[c.replicaID])
        #expect(aKnows.includes(deleted), "a learned c's report through b")
        #expect(c.seen?.reports[a.replicaID]?.includes(deleted) == true)
        // Settled: more quiet rounds send no seen message at all.
        let before = seenCount(ab, bc)
        now = try rounds(4, &a, &b, &c, &ab, &bc, from: now)
        #expect(seenCount(ab, bc) == before)
        #expect(before > 0)
    }

    @Test("in a full mesh (a–b, b–c, a–c) no seen message carries a third replica's report: each hears every other directly")
    func fullMeshSendsNoThirdPartyReports() throws {
        var a = CoreNode("a", seenGossip: true)
        var b = CoreNode("b", seenGossip: true)
        var c = CoreNode("c", seenGossip: true)
        // Each side learns the other's neighbours from the acks that followed (b's to a names c).
        var (ab, bc, ac) = try CoreLink.fullMesh(&a, &b, &c, now: t0)
        // Frames from here on: the mesh is complete and each side knows the other's neighbours.
        let (abA, abB, bcB, acB) = (ab.framesToA.count, ab.framesToB.count, bc.framesToB.count, ac.framesToB.count)
        try a.write { try $0.save(Location(name: "one")) }
        try c.write { try $0.save(Location(name: "two")) }
        var now = t0
        for _ in 0..<6 {
            now += .seconds(2)
            a.handle(a.core.tick(now: now))
            b.handle(b.core.tick(now: now))
            c.handle(c.core.tick(now: now))
            try ab.settle(&a, &b, now: now)
            try bc.settle(&b, &c, now: now)
            try ac.settle(&a, &c, now: now)
        }
        #expect(a.state.digest == b.state.digest && b.state.digest == c.state.digest)
        let replicas = Set([a.replicaID, b.replicaID, c.replicaID])
        /// The replicas reported in `frames[from...]` other than `sender`.
        func thirdParties(_ frames: [WireFrame], from start: Int, sender: ReplicaID) -> Set<ReplicaID> {
            Set(seenFrames(Array(frames[start...])).flatMap(\.reports.keys)).subtracting([sender])
        }
        #expect(thirdParties(ab.framesToB, from: abB, sender: a.replicaID).isEmpty)
        #expect(thirdParties(ab.framesToA, from: abA, sender: b.replicaID).isEmpty)
        #expect(thirdParties(bc.framesToB, from: bcB, sender: b.replicaID).isEmpty)
        #expect(thirdParties(ac.framesToB, from: acB, sender: a.replicaID).isEmpty)
        #expect(!seenFrames(Array(ab.framesToB[abB...])).isEmpty, "a still sends its own report and the stable context")
        // Each still knows what the others have seen (from their acks and own reports).
        for node in [a, b, c] {
            for other in replicas where other != node.replicaID {
                #expect(node.seen?.reports[other] != nil)
            }
        }
    }

    @Test("a peer that did not announce the feature gets no seen message")
    func onlyToPeersThatSpeakIt() throws {
        var a = CoreNode("a", seenGossip: true)
        var b = CoreNode("b")
        try a.write { try $0.save(Location(name: "x")) }
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        for step in 1...3 {
            let now = t0 + .seconds(2 * step)
            a.handle(a.core.tick(now: now))
            b.handle(b.core.tick(now: now))
            try link.settle(&a, &b, now: now)
        }
        #expect(seenFrames(link.framesToB).isEmpty)
        #expect(link.framesToB.contains { $0.type == Message.Kind.digest.rawValue })
        // b's acks still tell a what b has seen.
        #expect(a.seen?.reports[b.replicaID] == b.state.context)
    }

    @Test("a malformed seen message closes the session with reason 5; one before admission is refused")
    func malformedSeenIsRefused() throws {
        var a = CoreNode("a", seenGossip: true)
        var b = CoreNode("b", seenGossip: true)
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        var bad = SeenContexts().encodedBlob()
        bad[0] = 2  // another version
        a.handle(a.core.receive(link.aSession, type: SeenMessage.kind, body: bad, now: t0, wallClock: HybridLogicalClock.wallClock(),
                                state: a.state))
        let (batch, _) = a.core.nextBatch(link.aSession, budget: 1 << 20, now: t0, state: a.state)
        var splitter = FrameSplitter(maxFrameBytes: WireLimits.defaultMaxFrameBytes)
        splitter.append(batch?.bytes ?? [])
        var last: Message?
        while let frame = try splitter.next() { last = try? Message.decode(type: frame.type, body: frame.body) }
        guard case .error(.malformed, let text)? = last else {
            Issue.record("no malformed error")
            return
        }
        #expect(text.contains("seen"))

        var c = CoreNode("c", seenGossip: true)
        let early = c.open(initiator: false, address: "x", now: t0)
        c.handle(c.core.receive(early, type: SeenMessage.kind, body: SeenContexts().encodedBlob(), now: t0,
                                wallClock: HybridLogicalClock.wallClock(), state: c.state))
        #expect(c.core.session(early)?.phase == .closing)
    }
}
