import Foundation
import PeerSync
@_spi(Engine) import PeerSyncCRDT
@testable import PeerSyncReplication
@testable import PeerSyncNetwork
import PeerSyncTestSupport
@testable import PeerSyncWire
import Testing
import ShiftSchedulerModel

/// The replication decisions, driven without sockets, clocks or SQLite: two or three cores over
/// in-memory states, bytes moved by the harness, time passed in as instants.
@Suite("Replication core")
struct ReplicationCoreTests {
    let t0 = ContinuousClock.now

    func shiftTypes(_ count: Int, descriptionBytes: Int = 400) -> [ShiftType] {
        (0..<count).map { i in
            ShiftType(symbol: "S\(i % 100)", title: "Shift \(i)", description: String(repeating: "x", count: descriptionBytes),
                      duration: 3600, locationID: nil)
        }
    }

    @Test("catch-up honours a peer's 65,536-byte frame limit and converges")
    func catchUpWithinPeerLimit() throws {
        var a = CoreNode("a")
        var b = CoreNode("b", maxFrameBytes: 65_536)
        for record in shiftTypes(2_000) { try a.write { try $0.save(record) } }
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        #expect(link.framesToB.allSatisfy { $0.size <= 65_536 })
        #expect(link.framesToB.filter { $0.type == Message.Kind.chunk.rawValue }.count > 10)
        #expect(b.state.digest == a.state.digest)
        #expect(a.warnings.isEmpty && b.warnings.isEmpty)
        // The per-message traffic counters count every frame sent, chunks included.
        let sentByType = link.framesToB.reduce(into: [UInt8: Int]()) { $0[$1.type, default: 0] += $1.size }
        #expect(a.core.sessions[link.aSession]?.frameBytesSentByType == sentByType)
    }

    @Test("catch-up chunks are deflated for a peer whose hello says it reads them, and only for such a peer")
    func deflatedChunksOnlyWhenAnnounced() throws {
        func chunkFrames(_ frames: [WireFrame]) throws -> (deflated: Int, plain: Int) {
            var counts = (deflated: 0, plain: 0)
            for frame in frames where frame.type == Message.Kind.chunk.rawValue {
                if try FieldReader(message: "chunk", body: frame.body).varints[5] != nil { counts.deflated += 1 } else { counts.plain += 1 }
            }
            return counts
        }
        for bReads in [true, false] {
            var a = CoreNode("a")
            var b = CoreNode("b", deflateChunks: bReads)
            for record in shiftTypes(300) { try a.write { try $0.save(record) } }
            for record in shiftTypes(300) { try b.write { try $0.save(record) } }
            var link = CoreLink.connect(&a, &b, now: t0)
            try link.settle(&a, &b, now: t0)
            #expect(b.state.digest == a.state.digest)
            let helloFromB = try #require(link.framesToA.messages().compactMap { if case .hello(let h) = $0 { h } else { nil } }.first)
            #expect(helloFromB.features.contains(.deflatedChunks) == bReads)
            let toB = try chunkFrames(link.framesToB)
            let toA = try chunkFrames(link.framesToA)
            // b's setting governs what it announces and what it sends.
            #expect(bReads ? toB.deflated > 0 && toB.plain == 0 : toB.deflated == 0 && toB.plain > 0, "\(toB)")
            #expect(bReads ? toA.deflated > 0 : toA.deflated == 0 && toA.plain > 0, "\(toA)")
        }
    }

    /// Two settled nodes; a (with `timing`) saves shift types at offsets from `start`, each
    /// followed by a settle of the link.
    struct Stream {
        var a: CoreNode
        var b = CoreNode("b")
        var link: CoreLink
        let records: [ShiftType]
        let start: MonotonicInstant

        init(_ timing: SyncTiming, records: [ShiftType], at t0: MonotonicInstant) throws {
            self.records = records
            start = t0 + .seconds(1)
            a = CoreNode("a", timing: timing)
            link = CoreLink.connect(&a, &b, now: t0)
            try link.settle(&a, &b, now: t0)
        }

        var deltaFrames: Int { link.framesToB.filter { $0.type == Message.Kind.delta.rawValue }.count }

        mutating func write(_ i: Int, atMicroseconds offset: Int64) throws {
            let now = start + .microseconds(offset)
            let record = records[i]
            var (a, b, link) = (self.a, self.b, self.link)  // settle takes both nodes inout
            a.lastNow = now
            try a.write { try $0.save(record) }
            try link.settle(&a, &b, now: now)
            (self.a, self.b, self.link) = (a, b, link)
        }
    }

    @Test("a stream of deltas shares frames: one close behind the last waits for the coalescing window; a lone one goes at once")
    func streamCoalesces() throws {
        var timing = SyncTiming()
        timing.deltaCoalescing = .milliseconds(2)
        var s = try Stream(timing, records: shiftTypes(6, descriptionBytes: 10), at: t0)
        // A lone edit after a quiet time: sent at once.
        try s.write(0, atMicroseconds: 0)
        #expect(s.deltaFrames == 1)
        // Two more 0.5 ms and 1 ms later: held, with one wake asked for at start + 2 ms.
        try s.write(1, atMicroseconds: 500)
        try s.write(2, atMicroseconds: 1_000)
        #expect(s.deltaFrames == 1)
        #expect(s.a.wakes == [s.start + .milliseconds(2)])
        #expect(try s.b.state.fetchAll(ShiftType.self).count == 1)
        // At the wake both go, each in its own frame (the event form), in one batch.
        let due = s.start + .milliseconds(2)
        let (batch, _) = s.a.core.nextBatch(s.link.aSession, budget: 1 << 20, now: due, state: s.a.state)
        #expect(batch?.frames == 2)
        var splitter = FrameSplitter(maxFrameBytes: WireLimits.defaultMaxFrameBytes)
        splitter.append(batch?.bytes ?? [])
        while let frame = try splitter.next() {
            #expect(frame.type == Message.Kind.delta.rawValue)
            s.b.handle(s.b.core.receive(s.link.bSession, type: frame.type, body: frame.body, now: due,
                                        wallClock: HybridLogicalClock.wallClock(), state: s.b.state))
        }
        try s.link.settle(&s.a, &s.b, now: due)
        #expect(try s.b.state.fetchAll(ShiftType.self).count == 3)
        // Quiet again: the next lone edit is not held.
        try s.write(3, atMicroseconds: 50_000)
        #expect(s.deltaFrames == 2 && s.a.wakes.count == 1)
        #expect(s.b.state.digest == s.a.state.digest)
    }

    @Test("a dense stream does not wait for the whole window: the delta that makes deltaCoalescingCount waiting sends them all")
    func denseStreamGoesAtTheCount() throws {
        var timing = SyncTiming()
        timing.deltaCoalescing = .milliseconds(2)
        timing.deltaCoalescingCount = 3
        var s = try Stream(timing, records: shiftTypes(6, descriptionBytes: 10), at: t0)
        try s.write(0, atMicroseconds: 0)  // lone: at once
        #expect(s.deltaFrames == 1)
        try s.write(1, atMicroseconds: 200)
        try s.write(2, atMicroseconds: 400)
        #expect(s.deltaFrames == 1, "two waiting, under the count: held for the window")
        try s.write(3, atMicroseconds: 600)
        #expect(s.deltaFrames == 4, "the third waiting delta sends all three, 1.4 ms before the window ends")
        #expect(try s.b.state.fetchAll(ShiftType.self).count == 4)
        // The window starts again from that send: the next two wait, then the window's end (not
        // the count) sends them.
        try s.write(4, atMicroseconds: 800)
        try s.write(5, atMicroseconds: 1_000)
        #expect(s.deltaFrames == 4)
        #expect(s.a.wakes.last == s.start + .microseconds(2_600))
        let (batch, _) = s.a.core.nextBatch(s.link.aSession, budget: 1 << 20, now: s.start + .microseconds(2_600), state: s.a.state)
        #expect(batch?.frames == 2)
        // Both hellos announce event counters: every one of a's events went in form 02.
        let forms = s.link.framesToB.filter { $0.type == Message.Kind.delta.rawValue }.map { $0.body.first }
        #expect(!forms.isEmpty && forms.allSatisfy { $0 == 2 }, "\(forms)")
    }

    @Test("live deltas that arrive in one read share one commit; received with a commit start after each, the first commits alone")
    func deltasOfOneReadShareACommit() throws {
        for together in [true, false] {
            var a = CoreNode("a")
            var b = CoreNode("b")
            var link = CoreLink.connect(&a, &b, now: t0)
            try link.settle(&a, &b, now: t0)
            #expect(b.pendingCommits.isEmpty)
            // Three writes queued before a's writer pulls: one batch of three delta frames.
            let now = t0 + .seconds(1)
            a.lastNow = now
            for record in shiftTypes(3, descriptionBytes: 10) { try a.write { try $0.save(record) } }
            let (batch, _) = a.core.nextBatch(link.aSession, budget: 1 << 20, now: now, state: a.state)
            var splitter = FrameSplitter(maxFrameBytes: WireLimits.defaultMaxFrameBytes)
            splitter.append(batch?.bytes ?? [])
            var frames: [(type: UInt8, body: [UInt8])] = []
            while let frame = try splitter.next() { frames.append((frame.type, frame.body)) }
            #expect(frames.count == 3 && frames.allSatisfy { $0.type == Message.Kind.delta.rawValue })
            for frame in frames {
                b.handle(b.core.receive(link.bSession, type: frame.type, body: frame.body, now: now,
                                        wallClock: HybridLogicalClock.wallClock(), state: b.state, startingCommit: !together))
            }
            if together { b.handle(b.core.startCommitIfIdle(state: b.state, now: now)) }
            #expect(b.pendingCommits.map(\.deltas.count) == (together ? [3] : [1]), "together: \(together)")
            b.runCommits(now: now)
            #expect(try b.state.fetchAll(ShiftType.self).count == 3)
        }
    }

    @Test("a round whose context is a large cloud (a batch of writes not starting at counter 1) sends every field")
    func largeCloudContextRound() throws {
        var a = CoreNode("a")
        var b = CoreNode("b", maxFrameBytes: 65_536)
        var link = CoreLink.connect(&a, &b, now: t0)
        try a.write { try $0.save(ShiftType(symbol: "F", title: "first", duration: 60)) }
        try link.settle(&a, &b, now: t0)
        // 7,000 writes queued before the writer pulls: one joined delta over the peer's frame
        // limit, whose context is a cloud of 7,000 dots (it does not start at counter 1). At
        // 10 bytes a dot its bound alone was over the frame: every field was skipped.
        for record in shiftTypes(7_000, descriptionBytes: 10) { try a.write { try $0.save(record) } }
        try link.settle(&a, &b, now: t0)
        #expect(a.warnings.isEmpty, "\(a.warnings.prefix(2))")
        #expect(link.framesToB.allSatisfy { $0.size <= 65_536 })
        #expect(try b.state.fetchAll(ShiftType.self).count == 7_001)
        #expect(b.state.digest == a.state.digest)
    }

    @Test("coalesced live deltas over the peer's limit travel as a chunk round within it")
    func largeDeltaBecomesRound() throws {
        var a = CoreNode("a")
        var b = CoreNode("b", maxFrameBytes: 65_536)
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        let before = link.framesToB.count
        // 500 saves queued before the writer pulls: joined into one ~250 KB delta.
        for record in shiftTypes(500) { try a.write { try $0.save(record) } }
        try link.settle(&a, &b, now: t0)
        let live = link.framesToB[before...]
        #expect(live.allSatisfy { $0.size <= 65_536 })
        #expect(live.contains { $0.type == Message.Kind.chunk.rawValue })
        #expect(b.state.digest == a.state.digest)
    }

    @Test("a live delta of many long field names stays within the peer's 65,536-byte frame limit")
    func longNamesWithinPeerLimit() throws {
        var a = CoreNode("a")
        var b = CoreNode("b", maxFrameBytes: 65_536)
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        let before = link.framesToB.count
        // ~97 KB encoded (900 distinct 100-byte names, tiny values), though its size estimate,
        // which leaves names out, is under a third of the limit.
        var fields: [String: FieldValue] = [:]
        for i in 0..<900 { fields[String(format: "%03d", i) + String(repeating: "n", count: 97)] = .int(Int64(i)) }
        let key = RecordKey(collection: "wide", id: UUID())
        a.write { $0.upsert(fields, to: key) }
        try link.settle(&a, &b, now: t0)  // the link splits frames with b's limit: a larger one throws
        #expect(link.framesToB[before...].allSatisfy { $0.size <= 65_536 })
        #expect(b.state.digest == a.state.digest)
    }

    @Test("a record larger than a frame is split by fields; a field larger than a frame is skipped and logged")
    func oversizeRecord() throws {
        var a = CoreNode("a")
        var b = CoreNode("b", maxFrameBytes: 65_536)
        let key = RecordKey(collection: "notes", id: UUID())
        var fields: [String: FieldValue] = [:]
        for i in 0..<6 { fields["part\(i)"] = .string(String(repeating: "y", count: 20_000)) }
        fields["huge"] = .bytes(Array(repeating: 7, count: 70_000))
        a.write { $0.write(fields, to: key) }
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        #expect(link.framesToB.allSatisfy { $0.size <= 65_536 })
        let received = b.state.records.record(key)
        #expect(received?.fields.count == 6)
        #expect(received?.fields["huge"] == nil)
        #expect(received?.isVisible == true)
        #expect(a.warnings.contains { $0.metadata["field"] == "huge" })
    }

    @Test("a frame over the limit gets error reason 6 before the session closes")
    func frameTooLarge() throws {
        var a = CoreNode("a")
        var b = CoreNode("b")
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        b.handle(b.core.frameError(link.bSession, .frameTooLarge(length: 9_000_000, limit: 4 << 20), now: t0))
        let (batch, _) = b.core.nextBatch(link.bSession, budget: 1 << 20, now: t0, state: b.state)
        let frames = try decodeFrames(batch?.bytes ?? [])
        #expect(frames.last == .error(.frameTooLarge, "frame of 9000000 bytes exceeds the limit of 4194304"))
        #expect(batch?.closeAfter == true)
        #expect(b.warnings.contains { $0.message.contains("frame too large") })
    }

    @Test("a silent peer gets error reason 8 and is closed; keepalive pings flow while idle")
    func silentPeer() throws {
        var a = CoreNode("a")
        var b = CoreNode("b")
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        // The node's timer ticks every 100 ms. Quiet after the catch-up: ack and digest at 0.2 s;
        // then, idle, a ping a second later; and with nothing from b for 5 s, error reason 8.
        var sawPing = false
        var last: OutboundBatch?
        for ms in stride(from: 100, through: 5_000, by: 100) {
            let now = t0 + .milliseconds(ms)
            a.handle(a.core.tick(now: now))
            let (batch, _) = a.core.nextBatch(link.aSession, budget: 1 << 20, now: now, state: a.state)
            if let batch {
                last = batch
                if try decodeFrames(batch.bytes).contains(where: { if case .ping = $0 { true } else { false } }) { sawPing = true }
            }
        }
        #expect(sawPing)
        guard case .error(.timeout, let text)? = try decodeFrames(last?.bytes ?? []).last else {
            Issue.record("no timeout error frame")
            return
        }
        #expect(text.contains("no frame for 5 s"))
        #expect(last?.closeAfter == true)
    }

    @Test("a connection without a hello is closed after the handshake timeout with reason 8")
    func handshakeTimeout() throws {
        var a = CoreNode("a")
        let id = a.open(initiator: false, address: "mute", now: t0)
        _ = a.core.nextBatch(id, budget: 1 << 20, now: t0, state: a.state)  // our hello
        a.handle(a.core.tick(now: t0 + .seconds(9)))
        #expect(a.core.session(id)?.phase == .awaitingHello)
        a.handle(a.core.tick(now: t0 + .seconds(10)))
        let (batch, _) = a.core.nextBatch(id, budget: 1 << 20, now: t0 + .seconds(10), state: a.state)
        #expect(try decodeFrames(batch?.bytes ?? []).last == .error(.timeout, "no hello within 10 s"))
    }

    @Test("a hello refused before this side's own hello went out still gets that hello first, then the error (§5.1)")
    func helloBeforeError() throws {
        let stranger = DeviceKey.generate()
        func hello(version: UInt64 = WireLimits.protocolVersion, group: [UInt8]) -> Message {
            .hello(Hello(protocolVersion: version, replicaID: .random(), name: "x", wallClockMilliseconds: HybridLogicalClock.wallClock(),
                         context: CausalContext(), digest: .empty, groupID: group, deviceKey: stranger.publicKey.x963,
                         nonce: [UInt8](repeating: 1, count: 16)))
        }
        let cases: [(Message, CloseReason)] = [
            (hello(group: [UInt8](repeating: 7, count: 16)), .notAdmitted),
            (hello(version: 1, group: CoreNode.group.groupID.bytes), .protocolVersion),
        ]
        for (theirs, reason) in cases {
            var a = CoreNode("a")
            // The peer's hello is read before this side's writer ran (plain TCP: both start at connect).
            let id = a.open(initiator: false, address: "10.0.0.9:5555", now: t0)
            a.handle(a.core.receive(id, type: theirs.kind.rawValue, body: theirs.body(), now: t0,
                                    wallClock: HybridLogicalClock.wallClock(), state: a.state))
            let (batch, _) = a.core.nextBatch(id, budget: 1 << 20, now: t0, state: a.state)
            let frames = try decodeFrames(batch?.bytes ?? [])
            #expect(frames.count == 2, "\(frames)")
            guard case .hello(let ours)? = frames.first else {
                Issue.record("the first frame is not this side's hello: \(frames)")
                continue
            }
            #expect(ours.replicaID == a.replicaID)
            guard case .error(let sent, _)? = frames.last else {
                Issue.record("no error frame: \(frames)")
                continue
            }
            #expect(sent == reason)
            #expect(batch?.closeAfter == true)
        }
    }

    @Test("a closing session that cannot flush is cut after the drain timeout")
    func drainTimeout() throws {
        var a = CoreNode("a")
        let id = a.open(initiator: false, address: "stuck", now: t0)
        a.handle(a.core.refuse(id, .malformed, "test", now: t0))
        a.handle(a.core.tick(now: t0 + .seconds(1)))
        #expect(!a.closedTransports.contains(id))
        a.handle(a.core.tick(now: t0 + .seconds(2)))
        #expect(a.closedTransports.contains(id))
    }

    @Test("shutdown flushes pending deltas, then a goodbye, then closes")
    func goodbyeOnShutdown() throws {
        var a = CoreNode("a")
        var b = CoreNode("b")
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        let location = Location(name: "last words")
        try a.write { try $0.save(location) }
        a.handle(a.core.shutdown(now: t0))
        try link.settle(&a, &b, now: t0)
        let messages = link.framesToB.messages()
        #expect(messages.last == .goodbye(.shuttingDown, "node shutting down"))
        #expect(b.state.contains(location.recordKey))
        #expect(link.aClosed)
        #expect(b.events.contains { if case .peerDisconnected = $0 { true } else { false } })
    }

    @Test("deltas arriving while a commit is in flight are committed together in the next one")
    func groupCommit() throws {
        var a = CoreNode("a")
        var b = CoreNode("b")
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        let committedBefore = b.committedBatches.count
        // Hand b three delta frames without running its commits in between.
        for i in 0..<3 {
            try a.write { try $0.save(Location(name: "L\(i)")) }
            let (batch, _) = a.core.nextBatch(link.aSession, budget: 1 << 20, now: t0, state: a.state)
            for frame in try rawFrames(batch!.bytes) {
                b.handle(b.core.receive(link.bSession, type: frame.type, body: frame.body, now: t0,
                                        wallClock: HybridLogicalClock.wallClock(), state: b.state))
            }
        }
        #expect(b.pendingCommits.count == 1)  // the first one; the others wait for it
        b.runCommits(now: t0)
        let batches = b.committedBatches[committedBefore...].map(\.count)
        #expect(batches == [1, 2])
        #expect(try b.state.fetchAll(Location.self).count == 3)
    }

    /// b meets a and c, both holding writes b lacks; c's round is stopped halfway (b has some
    /// of its chunks, not the last) while a's arrives whole.
    private func roundsFromTwoPeers() throws -> (a: CoreNode, b: CoreNode, c: CoreNode, ab: CoreLink, cb: CoreLink) {
        var a = CoreNode("a")
        var b = CoreNode("b", maxFrameBytes: 65_536)
        var c = CoreNode("c", deflateChunks: false)  // chunks of b's frame size: a round of several
        try a.writeLocations(300, named: "a")
        try c.writeLocations(300, named: "c")
        var cb = CoreLink.connect(&c, &b, now: t0)
        // One batch at a time, each direction, until b holds part of c's round.
        for _ in 0..<100 where b.core.sessions[cb.bSession]?.link?.batch.isEmpty ?? true {
            try cb.step(&c, &b, budget: 16_384, now: t0)
        }
        #expect(b.core.sessions[cb.bSession]?.link?.batch.isEmpty == false, "c's round did not stop halfway")
        var ab = CoreLink.connect(&a, &b, now: t0)
        try ab.settle(&a, &b, now: t0)
        return (a, b, c, ab, cb)
    }

    @Test("a round that arrived whole waits for one still arriving on another session; both go in one commit")
    func roundsShareACommit() throws {
        var (a, b, c, _, cb) = try roundsFromTwoPeers()
        try expectRoundsShareACommit(a: a, b: &b, c: &c, cb: &cb)
    }

    /// b holds a's whole round (nothing committed, a commit asked for at the hold's end); once
    /// c's round is in, both go in b's next commit.
    private func expectRoundsShareACommit(a: CoreNode, b: inout CoreNode, c: inout CoreNode, cb: inout CoreLink,
                                          sourceLocation: SourceLocation = #_sourceLocation) throws {
        #expect(b.state.records.records(in: Location.collection).isEmpty, "a's round was committed alone",
                sourceLocation: sourceLocation)
        #expect(b.commitDeadlines == [t0 + SyncTiming.sendingAtOnce.roundCommitHold], sourceLocation: sourceLocation)
        let before = b.committedBatches.count
        try cb.settle(&c, &b, now: t0 + .milliseconds(10))
        let first = try #require(b.committedBatches[before...].first, sourceLocation: sourceLocation)
        let writers = Set(first.flatMap { delta in delta.allRecords.compactMap { $0.1.fields.values.first?.dot.replica } })
        #expect(writers.isSuperset(of: [a.replicaID, c.replicaID]), sourceLocation: sourceLocation)
        #expect(b.state.records.records(in: Location.collection).count == 600, sourceLocation: sourceLocation)
    }

    /// Nodes a, b and c, unconnected; a (and c if `cWrites`) holds 300 locations b lacks.
    private func threeNodes(cWrites: Bool) throws -> (CoreNode, CoreNode, CoreNode) {
        var a = CoreNode("a")
        var c = CoreNode("c")
        try a.writeLocations(300, named: "a")
        if cWrites { try c.writeLocations(300, named: "c") }
        return (a, CoreNode("b"), c)
    }

    @Test("a round waits for the first round of a peer whose hello showed writes this side lacks, before any of it arrives")
    func roundWaitsForAnOwedFirstRound() throws {
        var (a, b, c) = try threeNodes(cWrites: true)
        // c's hello reaches b (one batch each way); nothing of c's round has.
        var cb = CoreLink.connect(&c, &b, now: t0)
        try cb.step(&c, &b, budget: 16_384, now: t0)
        let owing = try #require(b.core.sessions[cb.bSession])
        #expect(owing.phase != .awaitingHello && owing.phase != .closing)
        #expect((owing.link?.batch.isEmpty ?? true) && owing.firstRoundPending)
        // a's whole round arrives meanwhile: it waits for c's (at most the hold).
        var ab = CoreLink.connect(&a, &b, now: t0)
        try ab.settle(&a, &b, now: t0)
        try expectRoundsShareACommit(a: a, b: &b, c: &c, cb: &cb)
        #expect(b.core.sessions[cb.bSession]?.firstRoundPending == false)
    }

    @Test("a first round still owed at the hold's end is not waited for again")
    func owedRoundWaitedForOnce() throws {
        var (a, b, c) = try threeNodes(cWrites: true)
        var cb = CoreLink.connect(&c, &b, now: t0)
        try cb.step(&c, &b, budget: 16_384, now: t0)
        var ab = CoreLink.connect(&a, &b, now: t0)
        try ab.settle(&a, &b, now: t0)
        #expect(b.pendingCommits.isEmpty && b.core.sessions[cb.bSession]?.firstRoundPending == true)
        // c never sends: at the hold's end a's round commits, and c's owed round no longer holds.
        b.handle(b.core.commitDue(now: t0 + SyncTiming.sendingAtOnce.roundCommitHold, state: b.state))
        #expect(b.pendingCommits.count == 1)
        #expect(b.core.sessions[cb.bSession]?.firstRoundPending == false)
        b.runCommits(now: t0 + .milliseconds(60))
        #expect(b.state.records.records(in: Location.collection).count == 300)
    }

    @Test("a peer whose hello shows nothing new to this side owes no round: a round from another peer commits at once")
    func noRoundOwedByAPeerWithNothingNew() throws {
        var (a, b, c) = try threeNodes(cWrites: false)
        var cb = CoreLink.connect(&c, &b, now: t0)
        try cb.settle(&c, &b, now: t0)  // c's roster claim reaches b: after it, c holds nothing b lacks
        cb.end(&c, &b)
        cb = CoreLink.connect(&c, &b, now: t0)
        try cb.step(&c, &b, budget: 16_384, now: t0)
        #expect(b.core.sessions[cb.bSession]?.firstRoundPending == false)
        var ab = CoreLink.connect(&a, &b, now: t0)
        try ab.settle(&a, &b, now: t0)
        #expect(b.commitDeadlines.isEmpty)
        #expect(b.state.records.records(in: Location.collection).count == 300)
    }

    @Test("a held round is committed at the hold's end when the other round stalls; a live delta is never held")
    func heldRoundCommitsAtTheDeadline() throws {
        var (a, b, _, ab, _) = try roundsFromTwoPeers()
        #expect(b.pendingCommits.isEmpty)
        b.handle(b.core.commitDue(now: t0 + .milliseconds(10), state: b.state))
        #expect(b.pendingCommits.isEmpty, "committed before the hold's end")
        b.handle(b.core.commitDue(now: t0 + SyncTiming.sendingAtOnce.roundCommitHold, state: b.state))
        #expect(b.pendingCommits.count == 1)
        b.runCommits(now: t0 + .milliseconds(50))
        #expect(b.state.records.records(in: Location.collection).count == 300)
        // c's round is still halfway; a live delta from a is committed at once all the same.
        try a.write { try $0.save(Location(name: "live")) }
        try ab.settle(&a, &b, now: t0 + .milliseconds(60))
        #expect(b.state.records.records(in: Location.collection).count == 301)
    }

    @Test("a batch carrying the handshake leaves the round's plan to the next batch, so the peer admits this side first")
    func handshakeBeforeRoundPlan() throws {
        var a = CoreNode("a")
        var b = CoreNode("b")
        try a.writeLocations(300, named: "early ")
        var link = CoreLink.connect(&a, &b, now: t0)
        // a's batches, one per step, by their messages.
        var batches: [[Message]] = []
        for _ in 0..<20 where !batches.contains(where: { $0.contains { $0.isChunk } }) {
            let sent = link.framesToB.count
            try link.step(&a, &b, budget: 1 << 20, now: t0)
            let messages = Array(link.framesToB[sent...]).messages()
            if !messages.isEmpty { batches.append(messages) }
        }
        let withAuth = try #require(batches.first { $0.contains { $0.isAuth } })
        #expect(!withAuth.contains { $0.isChunk }, "the round was planned and sent with the handshake")
        #expect(batches.last?.contains { $0.isChunk } == true, "no round followed the handshake")
        try link.settle(&a, &b, now: t0)
        #expect(b.state.records.records(in: Location.collection).count == 300)
    }

    @Test("a failed commit closes the session with an error and stores nothing")
    func commitFailure() throws {
        var a = CoreNode("a")
        var b = CoreNode("b")
        try a.write { try $0.save(Location(name: "will not land")) }
        b.failNextCommit = true
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        #expect(try b.state.fetchAll(Location.self).isEmpty)
        #expect(link.framesToA.messages().last == .error(.other, "the receiver's storage failed"))
        #expect(b.logs.contains { $0.level == .error })
    }

    @Test("the duplicate rule keeps the session dialed by the lower replica ID, on both ends")
    func duplicateRule() throws {
        var a = CoreNode("a")
        var b = CoreNode("b")
        var first = CoreLink.connect(&a, &b, now: t0)  // a dials b
        try first.settle(&a, &b, now: t0)
        var second = CoreLink.connect(&b, &a, now: t0)  // b dials a
        try second.settle(&b, &a, now: t0)
        try first.settle(&a, &b, now: t0)
        let lowerDialed = a.replicaID < b.replicaID ? first : second
        let kept = lowerDialed.aClosed || lowerDialed.bClosed
        #expect(!kept)
        #expect(first.aClosed != second.aClosed || first.bClosed != second.bClosed)
        #expect(a.core.peerStatuses().count == 1 && b.core.peerStatuses().count == 1)
    }

    @Test("forwarding: A–B–C carries an edit from A to C; C's own neighbour is not sent it twice")
    func forwarding() throws {
        var a = CoreNode("a")
        var b = CoreNode("b")
        var c = CoreNode("c")
        var ab = CoreLink.connect(&a, &b, now: t0)
        var bc = CoreLink.connect(&b, &c, now: t0)
        try ab.settle(&a, &b, now: t0)
        try bc.settle(&b, &c, now: t0)
        let location = Location(name: "from a")
        try a.write { try $0.save(location) }
        try ab.settle(&a, &b, now: t0)
        try bc.settle(&b, &c, now: t0)
        // The live edit goes at once, with the records of a's round b still owed c (a's claim
        // among them: c would refuse the edit without it).
        #expect(c.state.contains(location.recordKey))
        // c's claim reaches a once b's relay of c's round is due.
        for i in 1...3 {
            try ab.settle(&a, &b, now: t0 + .milliseconds(200 * i))
            try bc.settle(&b, &c, now: t0 + .milliseconds(200 * i))
        }
        #expect(a.state.digest == c.state.digest)
    }

    @Test("full mesh: chunks of a round (no context but the last's) are not forwarded to a peer connected to their writer")
    func chunksNotForwardedToTheWritersNeighbour() throws {
        var a = CoreNode("a", maxFrameBytes: 65_536)
        var b = CoreNode("b")
        var c = CoreNode("c")
        var (ab, bc, ac) = try CoreLink.fullMesh(&a, &b, &c, now: t0)
        let mark = (toA: ab.framesToA.count, toC: ac.framesToB.count)
        // One write of ~120 KB: over a's frame limit, so it reaches a as a round of several chunks.
        try b.writeLocations(300, named: "b")
        for i in 0..<3 {
            let now = t0 + .milliseconds(200 * i)  // past the relay delay
            try bc.settle(&b, &c, now: now)
            try ab.settle(&a, &b, now: now)
            try ac.settle(&a, &c, now: now)
        }
        #expect(a.state.digest == b.state.digest && b.state.digest == c.state.digest)
        #expect(ab.framesToA[mark.toA...].filter { $0.type == Message.Kind.chunk.rawValue }.count > 1)
        let forwarded = ac.framesToB[mark.toC...].filter { $0.type == Message.Kind.chunk.rawValue || $0.type == Message.Kind.delta.rawValue }
            .map(\.size).reduce(0, +)
        #expect(forwarded == 0, "a forwarded b's writes to c, b's neighbour")
    }

    @Test("a round committed in parts is relayed as a round of its own: the peer gets what it lacks, and its context covers only what it holds")
    func roundRelayedAsARound() throws {
        var a = CoreNode("a", maxFrameBytes: 65_536)
        a.core.settings.limits.catchUpBatchBytes = 1  // each chunk is committed alone
        var b = CoreNode("b")
        var c = CoreNode("c")
        var d = CoreNode("d")
        // c is b's neighbour, not d's.
        var ac = CoreLink.connect(&a, &c, now: t0)
        try ac.settle(&a, &c, now: t0)
        var bc = CoreLink.connect(&b, &c, now: t0)
        try bc.settle(&b, &c, now: t0)
        try ac.settle(&a, &c, now: t0)  // c's ack tells a that b is c's neighbour
        var bd = CoreLink.connect(&b, &d, now: t0)
        try bd.settle(&b, &d, now: t0)
        try d.writeLocations(150, named: "d")
        try bd.settle(&b, &d, now: t0)
        try b.writeLocations(400, named: "b")  // the b–c link is not pumped from here on
        // a meets b: b's round (b's and d's writes) reaches a in several parts.
        var ab = CoreLink.connect(&a, &b, now: t0)
        try ab.settle(&a, &b, now: t0)
        #expect(ab.framesToA.filter { $0.type == Message.Kind.chunk.rawValue }.count > 2)
        #expect(a.state.records.records(in: Location.collection).count == 550)  // b's and d's
        // Nothing goes to c before the relay delay: c might connect to d meanwhile.
        let mark = ac.framesToB.count
        try ac.settle(&a, &c, now: t0)
        #expect(!ac.framesToB[mark...].contains { $0.type == Message.Kind.chunk.rawValue || $0.type == Message.Kind.delta.rawValue })
        // Then c gets a round of what it lacks: d's writes (c hears d through nobody else), and
        // b's that b never sent it.
        try ac.settle(&a, &c, now: t0 + .milliseconds(200))
        #expect(ac.framesToB[mark...].contains { $0.type == Message.Kind.chunk.rawValue })
        #expect(c.state.records.records(in: Location.collection).count == 550)
        #expect(c.state.context == a.state.context && c.state.digest == a.state.digest)
    }

    @Test("healing a partition of three: a round relayed late is not sent at all once the peer is connected to its writer")
    func relayDroppedWhenThePeerMeetsTheWriter() throws {
        var a = CoreNode("a")
        var b = CoreNode("b")
        var c = CoreNode("c")
        var bc = CoreLink.connect(&b, &c, now: t0)
        try bc.settle(&b, &c, now: t0)
        try a.writeLocations(300, named: "a")  // a's writes while apart
        // a meets b first: b owes c a's records.
        var ab = CoreLink.connect(&a, &b, now: t0)
        try ab.settle(&a, &b, now: t0)
        #expect(b.state.records.records(in: Location.collection).count == 300)
        // Then a meets c, and c's ack tells b that a is now its neighbour.
        var ac = CoreLink.connect(&a, &c, now: t0 + .milliseconds(50))
        try ac.settle(&a, &c, now: t0 + .milliseconds(50))
        let mark = bc.framesToB.count
        try bc.settle(&b, &c, now: t0 + .milliseconds(50))  // c's ack with its new neighbour
        for i in 1...3 {
            try bc.settle(&b, &c, now: t0 + .milliseconds(100 * i))
            try ab.settle(&a, &b, now: t0 + .milliseconds(100 * i))
            try ac.settle(&a, &c, now: t0 + .milliseconds(100 * i))
        }
        #expect(a.state.digest == b.state.digest && b.state.digest == c.state.digest)
        let relayed = bc.framesToB[mark...].filter { $0.type == Message.Kind.chunk.rawValue || $0.type == Message.Kind.delta.rawValue }
        #expect(relayed.isEmpty, "b relayed \(relayed.map { ($0.type, $0.size) }) of a's round to c, a's neighbour")
    }

    @Test("line A–B–C: a round's records reach C through B after the relay delay (C is not connected to their writer)")
    func chunksForwardedAlongALine() throws {
        var a = CoreNode("a")
        var b = CoreNode("b", maxFrameBytes: 65_536)
        var c = CoreNode("c")
        var ab = CoreLink.connect(&a, &b, now: t0)
        var bc = CoreLink.connect(&b, &c, now: t0)
        for _ in 0..<2 {
            try ab.settle(&a, &b, now: t0)
            try bc.settle(&b, &c, now: t0)
        }
        let mark = (toB: ab.framesToB.count, toC: bc.framesToB.count)
        try a.writeLocations(300, named: "a")
        try ab.settle(&a, &b, now: t0)
        try bc.settle(&b, &c, now: t0)
        #expect(c.state.digest != a.state.digest, "relayed before the delay: \(bc.framesToB[mark.toC...].map { ($0.type, $0.size) })")
        try bc.settle(&b, &c, now: t0 + .milliseconds(100))
        try ab.settle(&a, &b, now: t0 + .milliseconds(100))  // c's claim, relayed to a
        #expect(ab.framesToB[mark.toB...].filter { $0.type == Message.Kind.chunk.rawValue }.count > 1)
        #expect(bc.framesToB[mark.toC...].contains { $0.type == Message.Kind.delta.rawValue || $0.type == Message.Kind.chunk.rawValue })
        #expect(c.state.digest == a.state.digest, "without a digest round: forwarded")
    }

    @Test("a peer that never reads: deltas beyond the budget are replaced by one catch-up round")
    func outboxOverflow() throws {
        var a = CoreNode("a", outboxDeltaBytes: 4_096)
        var b = CoreNode("b")
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        for record in shiftTypes(100, descriptionBytes: 100) { try a.write { try $0.save(record) } }
        #expect(a.core.session(link.aSession)?.out.resync == true)
        #expect(a.core.session(link.aSession)?.out.pendingDeltas.isEmpty == true)
        try link.settle(&a, &b, now: t0)
        #expect(b.state.digest == a.state.digest)
    }

    @Test("a peer that never reads: 10,000 pings and 1,000 acks leave one pong, one ack and one digest queued")
    func controlMessagesBounded() throws {
        var a = CoreNode("a")
        var b = CoreNode("b")
        try a.write { try $0.save(Location(name: "x")) }
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        // b keeps sending; nobody pulls a's output.
        let ack = try #require(try rawFrames(Message.ack(b.state.context, neighbors: nil).encodedFrame()).first)
        for nonce in 0..<10_000 {
            let ping = try #require(try rawFrames(Message.ping(UInt64(nonce)).encodedFrame()).first)
            a.handle(a.core.receive(link.aSession, type: ping.type, body: ping.body, now: t0, wallClock: HybridLogicalClock.wallClock(),
                                    state: a.state))
            if nonce % 10 == 0 {
                a.handle(a.core.receive(link.aSession, type: ack.type, body: ack.body, now: t0, wallClock: HybridLogicalClock.wallClock(),
                                        state: a.state))
            }
        }
        let out = try #require(a.core.session(link.aSession)?.out)
        #expect(out.pong == 9_999, "only the latest ping is answered")
        #expect(out.pendingDeltas.isEmpty && out.catchUp == nil && out.nextCatchUp == nil)
        // What a finally sends is a few frames, not 11,000.
        let (batch, actions) = a.core.nextBatch(link.aSession, budget: 1 << 20, now: t0 + .milliseconds(300), state: a.state)
        a.handle(actions)
        let messages = try decodeFrames(try #require(batch).bytes)
        #expect(messages.count <= 4, "\(messages)")
        #expect(messages.filter { if case .pong = $0 { true } else { false } }.count == 1)
        #expect(messages.filter { if case .ack = $0 { true } else { false } }.count <= 1)
        #expect(messages.filter { if case .digest = $0 { true } else { false } }.count <= 1)
        #expect(a.core.session(link.aSession)?.phase == .established)
    }

    @Test("a quiet session exchanges acks and digests and reports convergence")
    func digestsWhenQuiet() throws {
        var a = CoreNode("a")
        var b = CoreNode("b")
        try a.write { try $0.save(Location(name: "x")) }
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        let later = t0 + .milliseconds(300)
        a.handle(a.core.tick(now: later))
        b.handle(b.core.tick(now: later))
        try link.settle(&a, &b, now: later)
        #expect(a.events.contains { if case .converged = $0 { true } else { false } })
        #expect(b.events.contains { if case .converged = $0 { true } else { false } })
    }

    @Test("digest rounds are the node's: one digest per session once the node is quiet, acks only after a differing digest")
    func digestRoundsPerNode() throws {
        var a = CoreNode("a")
        var b = CoreNode("b")
        var c = CoreNode("c")
        var ab = CoreLink.connect(&a, &b, now: t0)
        var ac = CoreLink.connect(&a, &c, now: t0)
        try ab.settle(&a, &b, now: t0)
        try ac.settle(&a, &c, now: t0)
        func round(_ ms: Int) throws {
            let now = t0 + .milliseconds(ms)
            a.handle(a.core.tick(now: now))
            b.handle(b.core.tick(now: now))
            c.handle(c.core.tick(now: now))
            try ab.settle(&a, &b, now: now)
            try ac.settle(&a, &c, now: now)
        }
        // Two quiet rounds bring everything together (c's roster entry reaches b through a, so b
        // sees a second change and answers its differing digest with an ack and a digest).
        try round(300)
        try round(600)
        func digestsAfterLastData(_ frames: [WireFrame]) -> Int {
            let messages = frames.messages()
            let start = messages.lastIndex { if case .chunk = $0 { true } else if case .delta = $0 { true } else { false } } ?? 0
            return messages[start...].filter { $0.kind == .digest }.count
        }
        // One digest per session after its last change, not one per session tick.
        #expect(digestsAfterLastData(ab.framesToB) == 1)
        #expect(digestsAfterLastData(ac.framesToB) == 1)
        #expect(a.events.filter { if case .converged = $0 { true } else { false } }.count >= 2)
        // Converged and quiet: further rounds send nothing at all — no acks, no digests.
        let sent = [ab.framesToA.count, ab.framesToB.count, ac.framesToA.count, ac.framesToB.count]
        try round(900)
        try round(1_200)
        #expect([ab.framesToA.count, ab.framesToB.count, ac.framesToA.count, ac.framesToB.count] == sent)
        // A change on a busy node: b's edit reaches a and, forwarded, c; a's round waits until it
        // is quiet, and each of a's sessions then sends one digest.
        try b.write { try $0.save(Location(name: "from b")) }
        let busy = t0 + .milliseconds(1_250)
        try ab.settle(&a, &b, now: busy)
        try ac.settle(&a, &c, now: busy)
        let digestsBefore = ac.framesToB.messages().filter { $0.kind == .digest }.count
        a.handle(a.core.tick(now: busy + .milliseconds(100)))  // 100 ms after: not quiet yet
        try ac.settle(&a, &c, now: busy + .milliseconds(100))
        #expect(ac.framesToB.messages().filter { $0.kind == .digest }.count == digestsBefore)
        a.handle(a.core.tick(now: busy + .milliseconds(300)))
        try ac.settle(&a, &c, now: busy + .milliseconds(300))
        #expect(ac.framesToB.messages().filter { $0.kind == .digest }.count == digestsBefore + 1)
        #expect(c.state.digest == b.state.digest)
    }

    @Test("an ack after the first carries only the context entries that changed, and joins into the first")
    func incrementalAcks() throws {
        var a = CoreNode("a")
        var b = CoreNode("b")
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        // Many writers known to a; then one more write by a single writer.
        for i in 0..<20 {
            let writer = ReplicaID(high: 77, low: UInt64(i))
            let dot = Dot(replica: writer, counter: 1)
            a.state.apply(RecordMap(records: [(RecordKey, RecordState)](), context: CausalContext(dots: [dot]), maintainingDigest: false))
        }
        a.handle(a.core.receive(link.aSession, type: Message.Kind.digest.rawValue,
                                body: Message.digest(StateDigest(high: 1, low: 1), records: 0).body(),
                                now: t0, wallClock: HybridLogicalClock.wallClock(), state: a.state))
        let later = t0 + .milliseconds(300)
        a.handle(a.core.tick(now: later))
        try link.settle(&a, &b, now: later)
        try a.write { try $0.save(Location(name: "one more")) }
        try link.settle(&a, &b, now: later)
        a.handle(a.core.receive(link.aSession, type: Message.Kind.digest.rawValue,
                                body: Message.digest(StateDigest(high: 2, low: 2), records: 0).body(),
                                now: later, wallClock: HybridLogicalClock.wallClock(), state: a.state))
        let evenLater = later + .milliseconds(300)
        a.handle(a.core.tick(now: evenLater))
        try link.settle(&a, &b, now: evenLater)
        let acks = link.framesToB.messages().compactMap { message -> (CausalContext, Bool)? in
            if case .ack(let context, _, let incremental) = message { return (context, incremental) }
            return nil
        }
        let last = try #require(acks.last)
        #expect(last.1, "an ack after the first is incremental")
        #expect(last.0.replicas == [a.replicaID], "only the writer whose entry changed")
        #expect(b.core.session(link.bSession)?.link?.lastAckContext == a.state.context)
    }

    @Test("a session that fails its TLS handshake is logged with its cause")
    func refusedSessionIsLogged() throws {
        var a = CoreNode("a")
        let id = a.open(initiator: false, address: "10.0.0.9:5555", now: t0)
        a.handle(a.core.transportEnded(id, reason: .handshakeFailed(detail: "alert: decrypt error")))
        let line = a.logs.last
        #expect(line?.level == .warning)
        #expect(line?.metadata["peer.address"] == "10.0.0.9:5555")
        #expect(line?.metadata["reason"]?.contains("TLS handshake failed") == true)
    }

    func rawFrames(_ bytes: [UInt8]) throws -> [(type: UInt8, body: [UInt8])] {
        var splitter = FrameSplitter()
        splitter.append(bytes)
        var frames: [(type: UInt8, body: [UInt8])] = []
        while let frame = try splitter.next() { frames.append(frame) }
        return frames
    }

    func decodeFrames(_ bytes: [UInt8]) throws -> [Message] {
        try rawFrames(bytes).map { try Message.decode(type: $0.type, body: $0.body) }
    }
}

@Suite("Replication core: divergence and hostile deltas")
struct DivergenceTests {
    let t0 = ContinuousClock.now

    @Test("equal contexts, different states: the watchdog repairs by a full-state exchange and names what differs")
    func watchdogRepairs() throws {
        var a = CoreNode("a")
        var b = CoreNode("b")
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        // The same dot, different data on each side (what a restore under one ID produces).
        let writer = ReplicaID.random()
        let dot = Dot(replica: writer, counter: 1)
        func write(_ name: String, at key: RecordKey) -> RecordMap {
            let register = FieldRegister(value: .string(name), timestamp: HLCTimestamp(physicalMilliseconds: 1_700_000_000_000, logical: 0),
                                         dot: dot, supersedes: .zero)
            return RecordMap(records: [(key, RecordState(fields: ["name": register],
                                                         presence: [writer: PresenceEntry(counter: 1, removedBy: nil)]))],
                             context: CausalContext(dots: [dot]), maintainingDigest: false)
        }
        let keyA = RecordKey(collection: "locations", id: UUID())
        let keyB = RecordKey(collection: "locations", id: UUID())
        a.state.apply(write("only on a", at: keyA))
        b.state.apply(write("only on b", at: keyB))
        #expect(a.state.context == b.state.context && a.state.digest != b.state.digest)
        // First quiet round: digests only, and they differ; the next round carries acks, which
        // show equal contexts, so the digests that follow them trigger the repair.
        for ms in [300, 600] {
            let later = t0 + .milliseconds(ms)
            a.handle(a.core.tick(now: later))
            b.handle(b.core.tick(now: later))
            try link.settle(&a, &b, now: later)
        }
        #expect(a.events.contains { if case .divergenceRepaired = $0 { true } else { false } })
        #expect(a.state.digest == b.state.digest)
        #expect(a.state.contains(keyB) && b.state.contains(keyA))
        let detail = a.events.compactMap { event -> ([String], [ReplicaID])? in
            if case .divergenceDetail(_, let collections, let writers) = event { return (collections, writers) }
            return nil
        }.first
        #expect(detail?.0 == ["locations"])
        #expect(detail?.1 == [writer])
        #expect(a.core.repairs == 1)
    }

    @Test("one replica has purged a deleted record and the other not yet: equal events, equal digests, no repair (issue 29, item 5)")
    func compactionIsNotADivergence() throws {
        var a = CoreNode("a")
        var b = CoreNode("b")
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        try a.writeLocations(3, named: "kept", bytes: 10)
        try a.write { try $0.save(Location(name: "doomed")) }
        try link.settle(&a, &b, now: t0)
        let doomed = try #require(a.state.fetchAll(Location.self).first { $0.name == "doomed" })
        a.write { $0.delete(Location.self, id: doomed.id) }
        try link.settle(&a, &b, now: t0)
        #expect(a.state.context == b.state.context)
        // a compacts (the deletion is stable), b has not run its step yet — as in a compaction
        // run between batches, or one cut short by a kill.
        let purged = a.state.purge([doomed.recordKey], stable: a.state.context)
        #expect(purged.keys == [doomed.recordKey] && b.state.contains(doomed.recordKey) == false && b.state.records.record(doomed.recordKey) != nil)
        #expect(a.state.digest == b.state.digest, "a deleted record is not in the digest, held or purged")
        for ms in stride(from: 300, through: 3_000, by: 300) {
            let later = t0 + .milliseconds(ms)
            a.handle(a.core.tick(now: later))
            b.handle(b.core.tick(now: later))
            try link.settle(&a, &b, now: later)
        }
        #expect(a.core.repairs == 0 && b.core.repairs == 0)
        #expect(!(a.events + b.events).contains { if case .divergenceRepaired = $0 { true } else { false } })
    }

    @Test("a repair that does not reach equal digests is reported once, naming the peer and the records, and not repeated")
    func watchdogEscalates() throws {
        var a = CoreNode("a")
        var b = CoreNode("b")
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        // b holds a record whose every dot a's state counts as purged (a stable context it
        // compacted with) although a never held it: a drops it as an echo, in every repair.
        let writer = ReplicaID.random()
        let dot = Dot(replica: writer, counter: 1)
        let key = RecordKey(collection: "locations", id: UUID())
        let register = FieldRegister(value: .string("kept by b only"), timestamp: HLCTimestamp(physicalMilliseconds: 1_700_000_000_000, logical: 0),
                                     dot: dot, supersedes: .zero)
        b.state.apply(RecordMap(records: [(key, RecordState(fields: ["name": register], presence: [writer: PresenceEntry(counter: 1, removedBy: nil)]))],
                                context: CausalContext(dots: [dot]), maintainingDigest: false))
        a.state.apply(RecordMap(records: [], context: CausalContext(dots: [dot]), maintainingDigest: false))
        a.state.purge([], stable: a.state.context)
        #expect(a.state.context == b.state.context && a.state.digest != b.state.digest)
        for ms in stride(from: 300, through: 3_000, by: 300) {
            let later = t0 + .milliseconds(ms)
            a.handle(a.core.tick(now: later))
            b.handle(b.core.tick(now: later))
            try link.settle(&a, &b, now: later)
        }
        #expect(a.core.repairs == 1, "one repair per session, not one a minute")
        let persists = a.events.compactMap { event -> [RecordKey]? in
            if case .divergencePersists(_, _, _, let records) = event { return records }
            return nil
        }
        #expect(persists == [[key]], "reported once, with the record a did not take")
        #expect(a.warnings.filter { $0.message.contains("still differ") }.count == 1)
    }

    @Test("a delta holding a write in the receiver's own name it never made is refused; nothing is stored")
    func ownNameDot() throws {
        var a = CoreNode("a")
        var b = CoreNode("b")
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        let forged = Dot(replica: b.replicaID, counter: 9_000)
        let register = FieldRegister(value: .string("forged"), timestamp: HLCTimestamp(physicalMilliseconds: HybridLogicalClock.wallClock(), logical: 0),
                                     dot: forged, supersedes: .zero)
        let key = RecordKey(collection: "locations", id: UUID())
        let delta = RecordMap(records: [(key, RecordState(fields: ["name": register], presence: [b.replicaID: PresenceEntry(counter: 9_000, removedBy: nil)]))],
                              context: CausalContext(dots: [forged]), maintainingDigest: false)
        a.state.apply(delta)
        a.handle(a.core.broadcast(delta, state: a.state, now: t0))
        let before = b.state.digest
        try link.settle(&a, &b, now: t0)
        #expect(b.state.digest == before)
        #expect(link.framesToA.messages().contains { if case .error(.malformed, let text) = $0 { text.contains("never made") } else { false } })
        #expect(b.warnings.contains { $0.message.contains("closing session") })
    }

    /// A delta of one location written by `replica`, with `extra` roster entries in it.
    func write(by replica: ReplicaID, with extra: [RosterEntry] = []) throws -> (RecordMap, RecordKey) {
        var map = RecordMap()
        let now = HLCTimestamp(physicalMilliseconds: HybridLogicalClock.wallClock(), logical: 0)
        var delta = RecordMap.empty()
        for entry in extra { delta.merge(try map.write(entry.fields, to: entry.recordKey, at: now, by: replica)) }
        let key = RecordKey(collection: "locations", id: UUID())
        delta.merge(try map.write(["name": .string("by \(replica.shortDescription)")], to: key, at: now, by: replica))
        return (delta, key)
    }

    @Test("a delta naming a replica ID no device claims is refused with reason 14; nothing is stored; the node still writes")
    func unclaimedReplica() throws {
        var a = CoreNode("a")
        var b = CoreNode("b")
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        let digest = b.state.digest
        let (delta, key) = try write(by: ReplicaID.random())
        a.state.apply(delta)
        a.handle(a.core.broadcast(delta, state: a.state, now: t0))
        try link.settle(&a, &b, now: t0)
        #expect(b.state.digest == digest && !b.state.contains(key))
        #expect(link.framesToA.messages().contains { if case .error(.unclaimedReplica, let text) = $0 { text.contains("no device") } else { false } })
        #expect(b.warnings.contains { $0.message.contains("closing session") && $0.metadata["peer.id"] == a.replicaID.shortDescription })
        #expect(b.core.provisionalClaims.isEmpty)
        // Only that session ended: b still writes, and syncs with another peer.
        try b.write { try $0.save(Location(name: "after")) }
        var c = CoreNode("c")
        var other = CoreLink.connect(&b, &c, now: t0)
        try other.settle(&b, &c, now: t0)
        #expect(try c.state.fetchAll(Location.self).contains { $0.name == "after" })
        #expect(c.state.digest == b.state.digest)
    }

    @Test("a new replica's claim travels with its first writes: in one delta, or in an earlier chunk of the round")
    func claimWithWrites() throws {
        var a = CoreNode("a")
        var b = CoreNode("b")
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        // Device a continues under a new replica ID (a copied store) and claims it; claim and
        // first write go out in one delta.
        let fresh = ReplicaID.random()
        let key = CoreNode.group.keys[0]
        let claim = try RosterEntry.make(.writer(fresh), context: a.state.roster(of: CoreNode.group.groupID)
                                             .context(for: key.deviceID, at: a.state.nextTimestamp()), signer: key)
        let (delta, record) = try write(by: fresh, with: [claim])
        a.state.apply(delta)
        a.handle(a.core.broadcast(delta, state: a.state, now: t0))
        try link.settle(&a, &b, now: t0)
        #expect(b.state.contains(record))
        #expect(b.core.roster.isClaimed(fresh))
        #expect(!b.warnings.contains { $0.message.contains("closing session") })

        // A third device c first meets a with a small frame limit: the roster (with a's and b's
        // claims) comes in the first chunks, their writes in later ones, all committed at once.
        for i in 0..<40 { try a.write { try $0.save(Location(name: "L\(i)", address: String(repeating: "x", count: 2_000))) } }
        var c = CoreNode("c", maxFrameBytes: 65_536)
        var third = CoreLink.connect(&a, &c, now: t0)
        try third.settle(&a, &c, now: t0)
        #expect(third.framesToB.messages().count { if case .chunk = $0 { true } else { false } } > 1)
        #expect(c.state.digest == a.state.digest)
        #expect(!c.warnings.contains { $0.message.contains("closing session") })
        #expect(c.core.provisionalClaims.isEmpty)
    }

    @Test("a round cut into chunks sends each collection's records in base-dot order, so consecutive writes share chunks")
    func roundOrdersRecordsByBaseDot() throws {
        var a = CoreNode("a")
        var b = CoreNode("b")
        for i in 0..<300 {
            try a.write { try $0.save(Location(name: "a\(i)", address: String(repeating: "x", count: 400))) }
            try b.write { try $0.save(Location(name: "b\(i)", address: String(repeating: "y", count: 400))) }
        }
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        var round = CatchUpRound(a.state.records)
        round.plan(limit: 65_536, dictionary: WireDictionary(startingAt: 0))
        #expect(round.chunkCount > 3)
        let locations = round.items.filter { $0.0.collection == Location.collection }.map { WireDelta.sendOrder(of: $0.1) }
        #expect(locations.count == 600)
        #expect(locations == locations.sorted(), "records were cut into chunks in hash order")
    }

    @Test("live deltas wait for a catch-up round's roster records (they may overtake the rest of the round)")
    func deltasWaitForTheRoster() throws {
        var a = CoreNode("a")
        for i in 0..<40 { try a.write { try $0.save(Location(name: "L\(i)", address: String(repeating: "x", count: 2_000))) } }
        var round = CatchUpRound(a.state.records)
        #expect(round.holdsDeltasBack, "before it is planned")
        round.plan(limit: 65_536, dictionary: WireDictionary(startingAt: 0))
        #expect(round.chunkCount > 1 && round.holdsDeltasBack)
        _ = round.nextSlice()  // the roster (a few entries) fits in the first chunk
        #expect(!round.holdsDeltasBack && !round.isFinished)
        // A round without roster records holds nothing back.
        let locations = RecordMap(records: a.state.records.records(in: "locations").map { (RecordKey(collection: "locations", id: $0.0), $0.1) },
                                  context: a.state.context, maintainingDigest: false)
        #expect(!CatchUpRound(locations).holdsDeltasBack)

        // On a fresh session, a write made after admission but before the catch-up went out
        // reaches a peer that did not know its writer's claim: the roster goes first.
        var b = CoreNode("b")
        let (aSession, bSession) = (a.open(initiator: true, address: "b", now: t0), b.open(initiator: false, address: "a", now: t0))
        /// One batch from one side to the other.
        func pump(_ from: inout CoreNode, _ fromSession: SessionID, _ to: inout CoreNode, _ toSession: SessionID) throws {
            let (batch, actions) = from.core.nextBatch(fromSession, budget: 1 << 20, now: t0, state: from.state)
            from.handle(actions)
            guard let batch else { return }
            var splitter = FrameSplitter(maxFrameBytes: WireLimits.defaultMaxFrameBytes)
            splitter.append(batch.bytes)
            while let frame = try splitter.next() {
                to.handle(to.core.receive(toSession, type: frame.type, body: frame.body, now: t0,
                                          wallClock: HybridLogicalClock.wallClock(), state: to.state))
            }
        }
        try pump(&a, aSession, &b, bSession)  // a's hello
        try pump(&b, bSession, &a, aSession)  // b's hello and auth: a admits b and queues its catch-up
        #expect(a.core.established.count == 1 && b.core.established.isEmpty)
        let late = Location(name: "written as the session opened")
        try a.write { try $0.save(late) }
        var link = CoreLink(aSession: aSession, bSession: bSession)
        try link.settle(&a, &b, now: t0)
        #expect(!link.framesToA.messages().contains { if case .error = $0 { true } else { false } })
        #expect(b.state.contains(late.recordKey) && b.state.digest == a.state.digest)
        let kinds = link.framesToB.messages().map(\.kind)
        let firstChunk = try #require(kinds.firstIndex(of: .chunk))
        let firstDelta = try #require(kinds.firstIndex(of: .delta))
        #expect(firstChunk < firstDelta, "the delta went before the roster chunk: \(kinds)")
    }

    @Test("unclaimed replica IDs: refused unless the receiver already holds them or the group was upgraded from a shared secret")
    func unclaimedRule() throws {
        let node = CoreNode("a")
        let stranger = ReplicaID.random()
        let (delta, _) = try write(by: stranger)
        let roster = node.state.roster(of: CoreNode.group.groupID)
        #expect(delta.unclaimedReplica(roster: roster, known: node.state.context) == stranger)
        #expect(delta.unclaimedReplica(roster: roster, known: CausalContext(dots: [Dot(replica: stranger, counter: 7)])) == nil)
        #expect(delta.unclaimedReplica(roster: roster, known: node.state.context, claimedElsewhere: { $0 == stranger }) == nil)
        // Named only in the context, or only as a remover: refused just the same.
        let onlyContext = RecordMap(records: [], context: CausalContext(dots: [Dot(replica: stranger, counter: 1)]), maintainingDigest: false)
        #expect(onlyContext.unclaimedReplica(roster: roster, known: node.state.context) == stranger)
        let own = node.replicaID
        let removal = RecordMap(records: [(RecordKey(collection: "locations", id: UUID()),
                                           RecordState(presence: [own: PresenceEntry(counter: 1, removedBy: Dot(replica: stranger, counter: 1))]))],
                                context: CausalContext(), maintainingDigest: false)
        #expect(removal.unclaimedReplica(roster: roster, known: node.state.context) == stranger)
        // A removed device's replica stays claimed: its writes are judged by the cutoff instead.
        let (byA, _) = try write(by: own)
        let remover = CoreNode.group.keys[1]
        let removeA = try RosterEntry.make(roster.removal(of: CoreNode.group.keys[0].deviceID, seen: node.state.context),
                                           context: roster.context(for: remover.deviceID,
                                                                   at: HLCTimestamp(physicalMilliseconds: HybridLogicalClock.wallClock(), logical: 0)),
                                           signer: remover)
        let afterRemoval = roster.adding([removeA])
        #expect(afterRemoval.isRemoved(CoreNode.group.keys[0].deviceID) && afterRemoval.isClaimed(own))
        #expect(byA.unclaimedReplica(roster: afterRemoval, known: CausalContext()) == nil)
        // A group upgraded from a shared secret: its previous-version devices never claimed.
        let legacy = LegacyGroupKey(groupSecret: Array(repeating: 7, count: 32))
        let genesis = try RosterEntry.legacyGenesis(groupName: "old", timestamp: HLCTimestamp(physicalMilliseconds: 1_000, logical: 0),
                                                    legacyKey: legacy)
        let upgraded = Roster(groupID: legacy.groupID, entries: [genesis])
        #expect(upgraded.isUpgradedFromSharedSecret && !roster.isUpgradedFromSharedSecret)
        #expect(delta.unclaimedReplica(roster: upgraded, known: CausalContext()) == nil)
    }

    @Test("a peer that knows more writes in this replica's name than it has: restore detected, session refused")
    func restoreDetected() throws {
        var a = CoreNode("a")
        var b = CoreNode("b")
        for i in 0..<3 { try a.write { try $0.save(Location(name: "L\(i)")) } }
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        // a is "restored" to an empty state under the same replica ID.
        let restored = ReplicaState(replicaID: a.replicaID, name: "a")
        a.state = restored
        var again = CoreLink.connect(&a, &b, now: t0)
        try again.settle(&a, &b, now: t0)
        #expect(a.events.contains { event in
            if case .restoredStoreDetected(_, let replica, let known, 0, _) = event { return replica == a.replicaID && known >= 3 }
            return false
        })
        #expect(again.framesToB.messages().contains { if case .error(.replicaRestored, _) = $0 { true } else { false } })
    }
}

@Suite("Replication core: timers")
struct CoreTimerTests {
    let t0 = ContinuousClock.now

    @Test("a stall of the node's own timer is not counted as the peer's silence")
    func stallIsNotSilence() throws {
        var a = CoreNode("a")
        var b = CoreNode("b")
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        a.handle(a.core.tick(now: t0 + .milliseconds(100)))
        // The process is starved for 20 s; the first tick after it must not drop the peer…
        a.handle(a.core.tick(now: t0 + .seconds(20)))
        #expect(a.core.session(link.aSession)?.phase == .established)
        // …but a peer that then stays silent for the timeout is dropped.
        for ms in stride(from: 20_100, through: 25_200, by: 100) { a.handle(a.core.tick(now: t0 + .milliseconds(ms))) }
        #expect(a.core.session(link.aSession)?.phase == .closing)
    }
}

private extension Message {
    var isChunk: Bool { if case .chunk = self { true } else { false } }
    var isAuth: Bool { if case .auth = self { true } else { false } }
}
