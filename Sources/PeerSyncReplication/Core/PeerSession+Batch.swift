@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import PeerSyncWire

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
        budget: Int, state: some ReplicaView, localReplica: ReplicaID, neighbors: [ReplicaID], chunkTarget: Int, deflateChunks: Bool, now: MonotonicInstant,
        coalescing: Duration = .zero, coalescingCount: Int = .max, gossip: () -> [SeenReport]? = { nil }, onSkipped: (RecordKey, String) -> Void
    ) -> OutboundBatch? {
        let phase = self.phase
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
        // An admitted session's frames (while closing: those flushed before its goodbye). The link
        // is out of `state` meanwhile, so that what this adds to it is never a copy.
        if phase == .established || (phase == .closing && out.flushBeforeFinal), var link = takeLink() {
            defer { putLink(link) }
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
                let peerNeighbors = link.neighbors ?? []
                // The peer's own report goes back to it only when it says more than the peer
                // holds: then its store was put back from a backup, and this tells it (§19).
                let peerHolds = link.lastAckContext ?? peer.context
                let held = reports.filter { $0.replica != peer.replicaID || !peerHolds.includes($0.context) }
                let news = SeenReports(held).news(since: link.reportsSent) {
                    $0 != peer.replicaID && $0 != localReplica && peerNeighbors.contains($0)
                }
                // Within the peer's frame limit: as many as fit, the rest with the next round.
                var fitting = news
                while !fitting.isEmpty, SeenMessage.encodedFrame(fitting).count > link.maxFrame {
                    fitting.removeLast(max(1, fitting.count / 2))
                }
                if !fitting.isEmpty {
                    add(SeenMessage.encodedFrame(fitting))
                    for report in fitting { link.reportsSent[report.replica] = report.time }
                    if fitting.count < news.count { link.gossipPending = true }
                }
            }
            if out.ackDue {
                out.ackDue = false
                let newNeighbors = neighbors != link.neighborsSent ? neighbors : nil
                let message: Message?
                if let acked = link.ackedContext {
                    // Only what changed since the last ack (nothing at all if nothing did).
                    let changed = state.context.entriesChanged(since: acked)
                    message = changed.isEmpty && newNeighbors == nil ? nil : .ack(changed, neighbors: newNeighbors, incremental: true)
                } else {
                    message = .ack(state.context, neighbors: newNeighbors)
                }
                if let ack = message?.encodedFrame(), ack.count <= link.maxFrame {
                    add(ack)
                    link.ackedContext = state.context
                    if newNeighbors != nil { link.neighborsSent = neighbors }
                }
            }
            if out.digestDue {
                add(Message.digest(state.digest, records: UInt64(state.records.recordCount)).encodedFrame())
                out.digestDue = false
            }
            if out.breakdownDue {
                // Informational: one over the peer's limit (thousands of writers) is not sent.
                let breakdown = Message.breakdown(state.digest, state.records.digestBreakdown()).encodedFrame()
                if breakdown.count <= link.maxFrame { add(breakdown) }
                out.breakdownDue = false
            }
            if out.resync {
                out.resync = false
                // One round: the pending deltas joined into what the peer lacks, so its roster
                // records (a new incarnation's claim) go before the writes they authorise. As a
                // round of their own, ahead of the extract, they reached a peer before the claim
                // and it refused them (reason 14; seen after a restore in the month-long test).
                var extract = state.delta(missingFrom: link.delivered)
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
                   let last = link.lastDeltaSentAt, now < last + coalescing {
                    link.deltasHeldUntil = last + coalescing
                    return
                }
                let pending = out.pendingDeltas
                out.pendingDeltas = []
                out.deltaBytes = 0
                link.deltasHeldUntil = nil
                for delta in pending {
                    if fitsOneFrame(delta, maxFrame: link.maxFrame) {
                        add(Message.delta(WireDelta.encode(delta, with: outbound)).encodedFrame())
                        link.delivered.merge(delta.context)
                        link.lastDeltaSentAt = now
                    } else {
                        // Too large for the peer's frames: it travels as a catch-up round, which
                        // the receiver commits whole.
                        out.push(catchUp: delta)
                    }
                }
            }
            sendDeltas()
            encodeChunks(into: &bytes, frames: &frames, link: &link, budget: budget, chunkTarget: chunkTarget,
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
    private func fitsOneFrame(_ delta: RecordMap, maxFrame: Int) -> Bool {
        var bound = WireDelta.deltaOverheadBound + WireDelta.contextSizeBound(delta.context, with: outbound)
        for (key, state) in delta.allRecords {
            bound += WireDelta.encodedSizeBound(of: key, state, with: outbound)
            if bound > maxFrame { return false }
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
        into bytes: inout [UInt8], frames: inout Int, link: inout Link, budget: Int, chunkTarget: Int, deflate: Bool,
        planning: Bool, onSkipped: (RecordKey, String) -> Void
    ) {
        while bytes.count < budget {
            out.startNextCatchUp()
            guard var round = out.catchUp else { return }
            if !round.isPlanned {
                guard planning else { return }
                round.plan(limit: min(chunkTarget, link.maxFrame), dictionary: outbound)
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
            if slice.isLast { link.delivered.merge(round.context) }
            out.catchUp = round.isFinished ? nil : round
        }
    }
}
