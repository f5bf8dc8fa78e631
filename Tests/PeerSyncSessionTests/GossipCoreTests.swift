import Foundation
import PeerSync
@testable import PeerSyncReplication
@testable import PeerSyncNetwork
import PeerSyncTestSupport
@testable import PeerSyncWire
import Testing
import ShiftSchedulerModel

/// The compaction gossip (`seen`, type 16, signed reports) in the replication core, without
/// sockets or clocks.
@Suite("Compaction gossip in the core")
struct GossipCoreTests {
    let t0 = ContinuousClock.now

    func seenFrames(_ frames: [WireFrame]) -> [[SeenReport]] {
        frames.filter { $0.type == SeenMessage.kind }.compactMap { try? SeenMessage.decode(body: $0.body) }
    }

    /// Quiet rounds on a chain a–b–c: every node ticks after a quiet period, then the links settle.
    func rounds(_ count: Int, _ a: inout CoreNode, _ b: inout CoreNode, _ c: inout CoreNode, _ ab: inout CoreLink,
                _ bc: inout CoreLink, from start: ContinuousClock.Instant) throws -> ContinuousClock.Instant {
        var now = start
        for _ in 0..<count {
            now += .seconds(2)
            a.tick(now: now)
            b.tick(now: now)
            c.tick(now: now)
            try ab.settle(&a, &b, now: now)
            try bc.settle(&b, &c, now: now)
        }
        return now
    }

    func seenCount(_ links: CoreLink...) -> Int {
        links.reduce(0) { $0 + seenFrames($1.framesToA).count + seenFrames($1.framesToB).count }
    }

    /// A session of `node` in which `frame`'s `seen` body arrives; returns the error it closed with, if any.
    func deliverSeen(_ body: [UInt8], to node: inout CoreNode, on session: SessionID) throws -> Message? {
        node.handle(node.core.receive(session, type: SeenMessage.kind, body: body, now: t0, wallClock: HybridLogicalClock.wallClock(),
                                      state: node.state))
        let (batch, _) = node.core.nextBatch(session, budget: 1 << 20, now: t0, state: node.state)
        var splitter = FrameSplitter(maxFrameBytes: WireLimits.defaultMaxFrameBytes)
        splitter.append(batch?.bytes ?? [])
        var last: Message?
        while let frame = try splitter.next() { last = try? Message.decode(type: frame.type, body: frame.body) }
        return last
    }

    @Test("a learns what c has seen through b (a chain a–b–c), in c's own signed report; an idle group then sends no more")
    func gossipTravelsAndStops() throws {
        var a = CoreNode("a", signedReports: true)
        var b = CoreNode("b", signedReports: true)
        var c = CoreNode("c", signedReports: true)
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
        let fromC = try #require(a.seen?[c.replicaID])
        #expect(fromC.context.includes(deleted), "a learned c's report through b")
        #expect(fromC == c.ownReport, "relayed unchanged: the bytes c signed")
        #expect(fromC.verdict(in: a.core.roster) == .valid)
        #expect(c.seen?[a.replicaID]?.context.includes(deleted) == true)
        // Settled: more quiet rounds send no seen message at all.
        let before = seenCount(ab, bc)
        now = try rounds(4, &a, &b, &c, &ab, &bc, from: now)
        #expect(seenCount(ab, bc) == before)
        #expect(before > 0)
    }

    @Test("in a full mesh (a–b, b–c, a–c) no seen message carries a third replica's report: each hears every other directly")
    func fullMeshSendsNoThirdPartyReports() throws {
        var a = CoreNode("a", signedReports: true)
        var b = CoreNode("b", signedReports: true)
        var c = CoreNode("c", signedReports: true)
        var (ab, bc, ac) = try CoreLink.fullMesh(&a, &b, &c, now: t0)
        let (abA, abB, bcB, acB) = (ab.framesToA.count, ab.framesToB.count, bc.framesToB.count, ac.framesToB.count)
        try a.write { try $0.save(Location(name: "one")) }
        try c.write { try $0.save(Location(name: "two")) }
        var now = t0
        for _ in 0..<6 {
            now += .seconds(2)
            a.tick(now: now)
            b.tick(now: now)
            c.tick(now: now)
            try ab.settle(&a, &b, now: now)
            try bc.settle(&b, &c, now: now)
            try ac.settle(&a, &c, now: now)
        }
        #expect(a.state.digest == b.state.digest && b.state.digest == c.state.digest)
        let replicas = Set([a.replicaID, b.replicaID, c.replicaID])
        func thirdParties(_ frames: [WireFrame], from start: Int, sender: ReplicaID) -> Set<ReplicaID> {
            Set(seenFrames(Array(frames[start...])).flatMap { $0.map(\.replica) }).subtracting([sender])
        }
        #expect(thirdParties(ab.framesToB, from: abB, sender: a.replicaID).isEmpty)
        #expect(thirdParties(ab.framesToA, from: abA, sender: b.replicaID).isEmpty)
        #expect(thirdParties(bc.framesToB, from: bcB, sender: b.replicaID).isEmpty)
        #expect(thirdParties(ac.framesToB, from: acB, sender: a.replicaID).isEmpty)
        #expect(!seenFrames(Array(ab.framesToB[abB...])).isEmpty, "a still sends its own report")
        for node in [a, b, c] {
            for other in replicas where other != node.replicaID {
                #expect(node.seen?[other] != nil)
            }
        }
    }

    @Test("a peer that did not announce the feature gets no seen message, and acks do not count as reports")
    func onlyToPeersThatSpeakIt() throws {
        var a = CoreNode("a", signedReports: true)
        var b = CoreNode("b")
        try a.write { try $0.save(Location(name: "x")) }
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        for step in 1...3 {
            let now = t0 + .seconds(2 * step)
            a.tick(now: now)
            b.tick(now: now)
            try link.settle(&a, &b, now: now)
        }
        #expect(seenFrames(link.framesToB).isEmpty)
        #expect(link.framesToB.contains { $0.type == Message.Kind.digest.rawValue })
        #expect(a.seen?[b.replicaID] == nil, "b's acks are its word, not a signed report: they hold compaction back")
    }

    @Test("a malformed seen message closes the session with reason 5; one before admission is refused")
    func malformedSeenIsRefused() throws {
        var a = CoreNode("a", signedReports: true)
        var b = CoreNode("b", signedReports: true)
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        guard case .error(.malformed, let text)? = try deliverSeen([1, 0, 0], to: &a, on: link.aSession) else {
            Issue.record("no malformed error")
            return
        }
        #expect(text.contains("seen"))

        var c = CoreNode("c", signedReports: true)
        let early = c.open(initiator: false, address: "x", now: t0)
        c.handle(c.core.receive(early, type: SeenMessage.kind, body: SeenMessage.encodedBody([]), now: t0,
                                wallClock: HybridLogicalClock.wallClock(), state: c.state))
        #expect(c.core.session(early)?.phase == .closing)
    }

    @Test("a forged report — another key's signature, another group, a device reporting for another's replica — closes the session with reason 15 and is not kept")
    func forgedReportsAreRefused() throws {
        let group = CoreNode.group
        let keyA = group.keys[0], keyB = group.keys[1]
        for forge in 0..<3 {
            var a = CoreNode("a", signedReports: true)
            var b = CoreNode("b", signedReports: true)
            let c = CoreNode("c", signedReports: true)
            var link = CoreLink.connect(&a, &b, now: t0)
            try link.settle(&a, &b, now: t0)
            // b sends a report "of c" saying c has seen everything a holds.
            let everything = a.state.context
            let forged: SeenReport
            switch forge {
            case 0:  // names device c, signed by b's key
                let body = SeenReport.body(groupID: group.groupID.bytes, device: group.keys[2].deviceID.bytes, replica: c.replicaID,
                                           time: 1, context: everything)
                forged = SeenReport(groupID: group.groupID.bytes, device: group.keys[2].deviceID.bytes, replica: c.replicaID, time: 1,
                                    context: everything, signature: keyB.signature(for: SeenReport.signingDomain + body))
            case 1:  // a's own key, another group
                forged = SeenReport.signed(by: keyA, group: GroupID(bytes: Array(repeating: 9, count: 16))!, replica: a.replicaID,
                                           time: 1, context: everything)
            default:  // b signs for a's replica, which a claims
                forged = SeenReport.signed(by: keyB, group: group.groupID, replica: a.replicaID, time: 1, context: everything)
            }

            let last = try deliverSeen(SeenMessage.encodedBody([forged]), to: &a, on: link.aSession)
            guard case .error(.forgedReport, _)? = last else {
                Issue.record("forge \(forge): \(String(describing: last))")
                continue
            }
            #expect(a.seen?.isEmpty == true, "nothing of it was kept")
        }
    }

    @Test("an older report of a replica (a replay) changes nothing; a newer one replaces it")
    func olderReportsChangeNothing() throws {
        let group = CoreNode.group
        var a = CoreNode("a", signedReports: true)
        var b = CoreNode("b", signedReports: true)
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        let newer = SeenReport.signed(by: group.keys[1], group: group.groupID, replica: b.replicaID, time: 2_000, context: b.state.context)
        let older = SeenReport.signed(by: group.keys[1], group: group.groupID, replica: b.replicaID, time: 1_000,
                                      context: CausalContext(versionVector: [b.replicaID: 1]))
        #expect(try deliverSeen(SeenMessage.encodedBody([newer]), to: &a, on: link.aSession) == nil)
        #expect(a.seen?[b.replicaID] == newer)
        #expect(try deliverSeen(SeenMessage.encodedBody([older]), to: &a, on: link.aSession) == nil)
        #expect(a.seen?[b.replicaID] == newer)
    }

    @Test("a report whose replica claim has not reached the receiver yet is held, and counts once the claim arrives (the sender does not offer it again)")
    func reportBeforeItsClaimCountsLater() throws {
        let group = CoreNode.group
        var a = CoreNode("a", signedReports: true)
        var b = CoreNode("b", signedReports: true)
        let c = CoreNode("c", signedReports: true)
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        // c's claim on its replica is in c's store only: a cannot judge c's report yet.
        let report = SeenReport.signed(by: group.keys[2], group: group.groupID, replica: c.replicaID, time: 1_000, context: a.state.context)
        #expect(try deliverSeen(SeenMessage.encodedBody([report]), to: &a, on: link.aSession) == nil, "not an offence")
        #expect(a.seen?[c.replicaID] == nil)
        // The claim arrives (as with a catch-up's roster chunk) and the roster changes.
        _ = a.state.apply(c.state.records)
        a.handle(a.core.updateRoster(a.state.roster(of: group.groupID), identity: a.core.settings.identity, now: t0))
        #expect(a.seen?[c.replicaID] == report)
    }
    @Test("after a compaction step that purged, the next digest round sends every peer a digest (same digest, the new record count) and the peer finds it converged")
    func compactionIsAnnounced() throws {
        var a = CoreNode("a", signedReports: true)
        var b = CoreNode("b", signedReports: true)
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        try a.write { try $0.save(Location(name: "doomed")) }
        let id = try #require(a.state.fetchAll(Location.self).first?.id)
        try link.settle(&a, &b, now: t0)
        a.write { $0.delete(Location.self, id: id) }
        var now = t0
        for _ in 0..<4 {
            now += .seconds(2)
            a.tick(now: now)
            b.tick(now: now)
            try link.settle(&a, &b, now: now)
        }
        #expect(a.state.digest == b.state.digest)
        // Settled: a quiet round sends no digest.
        let settled = link.framesToB.count
        now += .seconds(2)
        a.tick(now: now)
        b.tick(now: now)
        try link.settle(&a, &b, now: now)
        #expect(!link.framesToB[settled...].contains { $0.type == Message.Kind.digest.rawValue })
        // a's compaction step purges the deleted record (its deletion is stable) and tells the core.
        let before = a.state.records.recordCount
        let purged = a.state.purge([RecordKey(collection: Location.collection, id: id)], stable: a.state.context)
        #expect(purged.keys.count == 1)
        a.handle(a.core.compacted(now: now))
        let convergedBefore = b.events.filter { if case .converged = $0 { true } else { false } }.count
        let sent = link.framesToB.count
        now += .seconds(2)
        a.tick(now: now)
        b.tick(now: now)
        try link.settle(&a, &b, now: now)
        let digests = link.framesToB[sent...].filter { $0.type == Message.Kind.digest.rawValue }
            .compactMap { try? Message.decode(type: $0.type, body: $0.body) }
        guard case .digest(let digest, let records)? = digests.first else {
            Issue.record("no digest after the compaction step")
            return
        }
        #expect(digest == a.state.digest && digest == b.state.digest, "a purge leaves the digest as it was (§8.4)")
        #expect(records == UInt64(before - 1))
        #expect(b.events.filter { if case .converged = $0 { true } else { false } }.count == convergedBefore + 1)
        #expect(a.core.repairs == 0 && b.core.repairs == 0)
    }
}
