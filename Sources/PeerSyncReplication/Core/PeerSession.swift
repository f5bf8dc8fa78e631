import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncWire

/// A point on the monotonic clock; every liveness and keepalive decision uses it.
package typealias MonotonicInstant = ContinuousClock.Instant

/// One session as the replication core sees it: the inbound rules (``SessionStateMachine``),
/// what the peer is known to have, timers, and what remains to be sent. A value type with no
/// I/O; ``ReplicationCore`` owns one per session.
struct PeerSession {
    enum Phase: Equatable {
        case awaitingHello
        /// The peer's hello passed; waiting for its auth (proof that it holds its device key).
        case authenticating
        /// An authenticated device unknown to the roster; waiting for its join entry.
        case joining
        case established
        /// A last message (goodbye or error) is queued or being flushed; nothing more is read.
        case closing
    }

    let id: SessionID
    let origin: SessionOrigin
    /// The nonce of this side's hello (the peer signs it).
    let nonce: [UInt8]
    /// The peer's device key, from its hello.
    var peerKey: DevicePublicKey?
    var phase = Phase.awaitingHello
    var machine: SessionStateMachine
    /// Dictionary for what this side sends; starts at this side's hello wall clock.
    let outbound: WireDictionary
    var out = OutboundQueue()
    /// The peer's frame limit (its hello's `maxFrameBytes`; the protocol minimum until then).
    var peerMaxFrame = WireLimits.minimumMaxFrameBytes
    /// Dots the peer has: its hello, what it acked, what was sent to it, what it sent.
    var delivered = CausalContext()
    /// The replicas the peer has sessions with, as it last said (nil: not known yet).
    var neighbors: Set<ReplicaID>?
    var openedAt: MonotonicInstant
    var lastReceived: MonotonicInstant
    var lastSent: MonotonicInstant
    var closingSince: MonotonicInstant?
    var changedSinceDigest = true
    /// Wall-clock ms when digests were last equal.
    var lastConvergedAt: UInt64?
    var endReason: SessionEndReason?
    /// `peerConnected` was reported for this session.
    var announced = false
    /// The peer's context as its acks say (incremental acks joined into the one before; its
    /// digest that follows describes this state). Nil before its first ack.
    var lastAckContext: CausalContext?
    /// What this side's acks told the peer its context is (nil before the first ack): the next
    /// ack carries only the entries that changed since.
    var ackedContext: CausalContext?
    /// The neighbour list this side's acks last carried (sent again only when it changes).
    var neighborsSent: [ReplicaID]?
    /// The peer's digest differed from ours: send an ack with the next digest.
    var ackOwed = false
    /// The time of each report sent to the peer: the next `seen` carries only newer ones.
    var reportsSent: [ReplicaID: UInt64] = [:]
    /// The local gossip grew since the last digest round: send it with the next one.
    var gossipPending = false
    /// The peer's round in progress is complete (its first chunk named the stable context it
    /// compacted with): the keys of the records it carried so far.
    var completeRound: CompleteRound?
    /// The peer's auth said this store was restored: the newest time it knows of its lost future.
    var peerLostSince: UInt64?
    /// When a frame of live deltas last went to the peer (for coalescing a stream of them).
    var lastDeltaSentAt: MonotonicInstant?
    /// Live deltas are held back until this instant (a stream is being coalesced); the core
    /// asked for a wake at it.
    var deltasHeldUntil: MonotonicInstant?
    /// When the watchdog repaired this session by a full-state exchange (once per session).
    var lastRepairAt: MonotonicInstant?
    /// The digests still differed after the repair: reported once, not repaired again.
    var divergencePersists = false
    /// Where the last divergence was (the peer's breakdown against ours), and records of the
    /// peer's rounds this side did not take as echoes of purged ones (at most 100).
    var divergence: (collections: [String], writers: [ReplicaID]) = ([], [])
    var echoesDropped: Set<RecordKey> = []
    /// Received catch-up chunks waiting to be committed together.
    var batch: [RecordMap] = []
    var batchBytes = 0
    /// The peer's hello showed events this replica lacks and its first round (what it sends on
    /// admission) has not ended yet: rounds queued meanwhile may wait for it (group commit).
    var firstRoundPending = false
    /// Records of other peers' catch-up rounds are owed to this peer at this instant (as a
    /// round of what it lacks), unless by then its neighbours cover ``relayWriters``.
    var relayDue: MonotonicInstant?
    /// The replicas that wrote the records owed (PROTOCOL §6.6).
    var relayWriters: Set<ReplicaID> = []
    var framesSent = 0
    var framesReceived = 0
    var bytesSent = 0
    /// Frame bytes sent, by message type (TLS not included): what the traffic is made of.
    var frameBytesSentByType: [UInt8: Int] = [:]
    var bytesReceived = 0
    var nextNonce: UInt64 = 0

    init(id: SessionID, origin: SessionOrigin, machine: SessionStateMachine, hello: Hello, now: MonotonicInstant) {
        self.id = id
        self.origin = origin
        self.machine = machine
        outbound = WireDictionary(startingAt: hello.wallClockMilliseconds)
        nonce = hello.nonce ?? []
        out.hello = hello
        openedAt = now
        lastReceived = now
        lastSent = now
    }

    var peer: Hello? { machine.peer }

    /// Whether the peer gets records by each of `writers` from the writer itself: it is the
    /// writer, or a neighbour its last ack named.
    func hearsDirectly(from writers: Set<ReplicaID>) -> Bool {
        guard let peer = peer?.replicaID else { return false }
        return writers.allSatisfy { $0 == peer || (neighbors?.contains($0) ?? false) }
    }

    /// A relay that is due at `now` becomes a catch-up round of what the peer lacks, unless
    /// the peer now hears every writer directly. Live deltas queued for the peer make it due at
    /// once: they may be writes of a replica whose claim (a roster record) is among the records
    /// owed, and the peer refuses writes by replicas it does not know to be claimed — a round
    /// sends roster records first, and the deltas join it.
    mutating func takeDueRelay(now: MonotonicInstant) {
        guard let due = relayDue, now >= due || !out.pendingDeltas.isEmpty else { return }
        relayDue = nil
        if phase == .established, !hearsDirectly(from: relayWriters) { out.resync = true }
        relayWriters = []
    }

    var info: PeerInfo? {
        peer.map { PeerInfo(replicaID: $0.replicaID, name: $0.name, address: origin.address, dialed: origin.initiator,
                            deviceID: peerKey?.deviceID) }
    }

    /// Ends the session after `message` (an error now; a goodbye after pending deltas).
    mutating func close(with message: Message?, reason: SessionEndReason, flushFirst: Bool = false, now: MonotonicInstant) {
        if endReason == nil { endReason = reason }
        guard phase != .closing else { return }
        let wasEstablished = phase == .established
        phase = .closing
        closingSince = now
        out.final = message
        out.flushBeforeFinal = flushFirst
        // An unsent hello still goes first (§5.1: both sides send their hello first): the peer's
        // hello may be read and refused (another group, another version) before this side's
        // writer ran, over plain TCP as over TLS.
        out.auth = nil
        out.join = nil
        if !flushFirst || !wasEstablished {
            out.catchUp = nil
            out.nextCatchUp = nil
            out.pendingDeltas = []
            out.resync = false
        }
        out.ackDue = false
        out.digestDue = false
        out.gossipDue = false
        out.ping = nil
        out.pong = nil
    }
}

/// Bytes ready for a session's transport.
package struct OutboundBatch: Sendable {
    /// One or more whole frames.
    public let bytes: [UInt8]
    public let frames: Int
    /// Close the transport after writing these bytes (a goodbye or an error was the last frame).
    public let closeAfter: Bool
}

extension PeerSession {
    /// Encodes what is due, up to about `budget` bytes (at least one frame). Marks what it
    /// encodes as delivered to the peer. Returns nil when there is nothing to send.
    /// `deflateChunks`: deflate catch-up chunks if the peer's hello says it reads them.
    mutating func nextBatch(
        budget: Int, state: ReplicaState, neighbors: [ReplicaID], chunkTarget: Int, deflateChunks: Bool, now: MonotonicInstant,
        coalescing: Duration = .zero, coalescingCount: Int = .max, gossip: () -> [SeenReport]? = { nil }, onSkipped: (RecordKey, String) -> Void
    ) -> OutboundBatch? {
        var bytes: [UInt8] = []
        var frames = 0
        var closeAfter = false
        func add(_ frame: [UInt8]) {
            bytes += frame
            frames += 1
            countSent(frame)
        }
        if let hello = out.hello {
            add(Message.hello(hello).encodedFrame())
            out.hello = nil
        }
        if phase != .closing, let signature = out.auth {
            add(Message.auth(signature: signature, lostSince: out.authLostSince).encodedFrame())
            out.auth = nil
        }
        if phase == .established || phase == .joining, let entries = out.join {
            add(Message.join(entries: entries).encodedFrame())
            out.join = nil
        }
        // The peer admits this side only once it has these: they never wait for a round's plan.
        let handshake = frames > 0
        if phase == .established || (phase == .closing && out.flushBeforeFinal) {
            if let nonce = out.pong {
                add(Message.pong(nonce).encodedFrame())
                out.pong = nil
            }
            if let nonce = out.ping {
                add(Message.ping(nonce).encodedFrame())
                out.ping = nil
            }
            // The compaction gossip rides with quiet digest rounds (and every 10 s while busy:
            // ReplicationCore.tick), and with a session's first batch; it carries only reports
            // this peer was not sent yet and cannot hear itself (PROTOCOL §19): in a full mesh,
            // our own report when it changed.
            let gossipDue = out.gossipDue
            out.gossipDue = false
            if gossipDue, let peer, peer.features.contains(.signedReports), let reports = gossip() {
                let peerNeighbors = self.neighbors ?? []
                // The peer's own report goes back to it only when it says more than the peer
                // holds: then its store was put back from a backup, and this tells it (§19).
                let peerHolds = lastAckContext ?? peer.context
                let held = reports.filter { $0.replica != peer.replicaID || !peerHolds.includes($0.context) }
                let news = SeenReports(held).news(since: reportsSent) {
                    $0 != peer.replicaID && $0 != state.replicaID && peerNeighbors.contains($0)
                }
                // Within the peer's frame limit: as many as fit, the rest with the next round.
                var fitting = news
                while !fitting.isEmpty, SeenMessage.encodedFrame(fitting).count > peerMaxFrame {
                    fitting.removeLast(max(1, fitting.count / 2))
                }
                if !fitting.isEmpty {
                    add(SeenMessage.encodedFrame(fitting))
                    for report in fitting { reportsSent[report.replica] = report.time }
                    if fitting.count < news.count { gossipPending = true }
                }
            }
            if out.ackDue {
                out.ackDue = false
                let newNeighbors = neighbors != neighborsSent ? neighbors : nil
                let message: Message?
                if let acked = ackedContext {
                    // Only what changed since the last ack (nothing at all if nothing did).
                    let changed = state.context.entriesChanged(since: acked)
                    message = changed.isEmpty && newNeighbors == nil ? nil : .ack(changed, neighbors: newNeighbors, incremental: true)
                } else {
                    message = .ack(state.context, neighbors: newNeighbors)
                }
                if let ack = message?.encodedFrame(), ack.count <= peerMaxFrame {
                    add(ack)
                    ackedContext = state.context
                    if newNeighbors != nil { neighborsSent = neighbors }
                }
            }
            if out.digestDue {
                add(Message.digest(state.digest, records: UInt64(state.records.recordCount)).encodedFrame())
                out.digestDue = false
            }
            if out.breakdownDue {
                // Informational: one over the peer's limit (thousands of writers) is not sent.
                let breakdown = Message.breakdown(state.digest, state.records.digestBreakdown()).encodedFrame()
                if breakdown.count <= peerMaxFrame { add(breakdown) }
                out.breakdownDue = false
            }
            if out.resync {
                out.resync = false
                // One round: the pending deltas joined into what the peer lacks, so its roster
                // records (a new incarnation's claim) go before the writes they authorise. As a
                // round of their own, ahead of the extract, they reached a peer before the claim
                // and it refused them (reason 14; seen after a restore in the month-long test).
                var extract = state.delta(missingFrom: delivered)
                if let pending = out.joinedDeltas { extract.merge(pending) }
                out.pendingDeltas = []
                out.deltaBytes = 0
                out.push(catchUp: extract)
            }
            // Live deltas go before the rest of a catch-up round, but after its roster records:
            // the peer refuses writes by replica IDs it does not know to be claimed.
            func sendDeltas() {
                guard !out.pendingDeltas.isEmpty, out.catchUp?.holdsDeltasBack != true else { return }
                // A delta close behind the previous one waits for more to share its TLS record,
                // unless other frames go now anyway (it rides with them), enough deltas wait
                // already, or the session closes.
                if phase == .established, frames == 0, out.catchUp == nil, out.nextCatchUp == nil,
                   out.pendingDeltas.count < min(coalescingCount, OutboundQueue.separateDeltaLimit),
                   let last = lastDeltaSentAt, now < last + coalescing {
                    deltasHeldUntil = last + coalescing
                    return
                }
                let pending = out.pendingDeltas
                out.pendingDeltas = []
                out.deltaBytes = 0
                deltasHeldUntil = nil
                for delta in pending {
                    if fitsOneFrame(delta) {
                        add(Message.delta(WireDelta.encode(delta, with: outbound)).encodedFrame())
                        delivered.merge(delta.context)
                        lastDeltaSentAt = now
                    } else {
                        // Too large for the peer's frames: it travels as a catch-up round, which
                        // the receiver commits whole.
                        out.push(catchUp: delta)
                    }
                }
            }
            sendDeltas()
            encodeChunks(into: &bytes, frames: &frames, budget: budget, chunkTarget: chunkTarget,
                         deflate: deflateChunks && peer?.features.contains(.deflatedChunks) == true,
                         planning: !handshake, onSkipped: onSkipped)
            sendDeltas()
        }
        let flushed = out.pendingDeltas.isEmpty && out.catchUp == nil && out.nextCatchUp == nil && !out.resync
        if phase == .closing, let final = out.final, flushed || !out.flushBeforeFinal {
            add(final.encodedFrame())
            out.final = nil
            closeAfter = true
        } else if phase == .closing && out.final == nil && !out.hasWork {
            closeAfter = true
        }
        guard frames > 0 || closeAfter else { return nil }
        lastSent = now
        framesSent += frames
        bytesSent += bytes.count
        return OutboundBatch(bytes: bytes, frames: frames, closeAfter: closeAfter)
    }

    /// Whether `delta` encodes within the peer's frame limit, by an upper bound (not an
    /// estimate: `approximateWireBytes` leaves out names, so many long field names made a frame
    /// over the limit pass a check on it).
    private func fitsOneFrame(_ delta: RecordMap) -> Bool {
        var bound = WireDelta.deltaOverheadBound + WireDelta.contextSizeBound(delta.context, with: outbound)
        for (key, state) in delta.allRecords {
            bound += WireDelta.encodedSizeBound(of: key, state, with: outbound)
            if bound > peerMaxFrame { return false }
        }
        return true
    }

    /// Adds a frame being sent to the per-message traffic counters.
    private mutating func countSent(_ frame: [UInt8]) {
        if let type = Frame.messageType(of: frame) { frameBytesSentByType[type, default: 0] += frame.count }
    }

    /// `planning`: whether a round not yet planned may be planned now. Planning costs O(records
    /// of the round) — 150 ms for 100k records — so a batch carrying the handshake leaves it to
    /// the next batch (the writer asks again at once): the peer admits this side, and sends its
    /// own round, meanwhile.
    private mutating func encodeChunks(
        into bytes: inout [UInt8], frames: inout Int, budget: Int, chunkTarget: Int, deflate: Bool,
        planning: Bool, onSkipped: (RecordKey, String) -> Void
    ) {
        while bytes.count < budget {
            out.startNextCatchUp()
            guard var round = out.catchUp else { return }
            if !round.isPlanned {
                guard planning else { return }
                round.plan(limit: min(chunkTarget, peerMaxFrame), dictionary: outbound)
                for (key, field) in round.skipped { onSkipped(key, field) }
            }
            let slice = round.nextSlice()
            let payload = WireDelta.encode(records: slice.records, context: slice.isLast ? round.context : CausalContext(),
                                           with: outbound)
            let frame = Message.chunk(index: UInt64(slice.index), count: UInt64(round.chunkCount), records: UInt64(slice.records.count),
                                      delta: payload, stable: slice.index == 0 ? round.stable : nil).encodedFrame(deflatingChunk: deflate)
            bytes += frame
            frames += 1
            countSent(frame)
            if slice.isLast { delivered.merge(round.context) }
            out.catchUp = round.isFinished ? nil : round
        }
    }
}
