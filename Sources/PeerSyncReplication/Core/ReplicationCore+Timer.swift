@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncWire

/// The node's timer (keepalive, dead peers, digest rounds, handshake timeouts), what each
/// session's writer sends next, and status.
extension ReplicationCore {
    // MARK: - Timer

    /// While busy, the compaction gossip goes with one digest round in this many.
    static let busyGossipRounds = 5

    /// The node's one timer: keepalives, acks and digests when quiet, dead peers, handshakes
    /// that never finish, closings that never flush.
    mutating func tick(now: MonotonicInstant) -> [Action] {
        var actions: [Action] = []
        let timing = settings.timing
        // A node whose own timer ran late (its process starved of CPU, or suspended) did not hear
        // from its peers for the same reason: the stall beyond a few ticks is not their silence.
        if let last = lastTick, now - last > timing.tick * 10 {
            let stall = now - last - timing.tick
            for id in sessions.keys {
                sessions[id]?.postpone(by: stall, until: now)
            }
        }
        lastTick = now
        // Digest rounds are the node's, not each session's: once nothing has moved anywhere for a
        // quiet period (or, while busy, every 10 of them), every session that carried a change
        // sends one digest — with an ack only if the peer's last digest differed from ours.
        let quiet = lastActivity.map { now - $0 >= timing.digestQuietPeriod } ?? true
        // While busy, a round every 10 quiet periods — or one per quiet period per session when
        // there are more than 10: a round costs a digest (and maybe an ack) per session, so a node
        // with many peers spaces its busy rounds to keep their bytes per second bounded.
        let busyRounds = timing.digestQuietPeriod * max(10, established.count)
        let roundDue = quiet || lastRound.map { now - $0 >= busyRounds } ?? false
        if roundDue || lastRound == nil { lastRound = now }
        // The compaction gossip is not urgent: it goes with quiet rounds, and while busy with one
        // round in `busyGossipRounds` (every 10 s at the default timing, up to 10 peers). In a
        // busy 64-peer mesh it was most of the traffic when it went with every round.
        let gossipRound = roundDue && (quiet || lastGossipRound.map {
            now - $0 >= busyRounds * Self.busyGossipRounds
        } ?? true)
        if gossipRound { lastGossipRound = now }
        for id in sessions.keys.sorted() {
            guard var session = sessions[id] else { continue }
            switch session.state {
            case .closing(let closing):
                if now - closing.since >= timing.closeDrainTimeout {
                    actions.append(.closeTransport(id))
                }
            case .awaitingHello, .authenticating, .joining:
                if now - session.openedAt >= timing.handshakeTimeout {
                    let what = session.phase == .awaitingHello ? "no hello" : "no admission"
                    actions += refuse(id, .timeout, "\(what) within \(formatSeconds(timing.handshakeTimeout.millisecondsDouble / 1000))", now: now)
                    continue
                }
            case .established(_, let link):
                // A relay whose own wake was lost (the writer busy) goes with the next tick.
                if let due = link.relayDue, now >= due { actions.append(.wake(id)) }
                let silence = now - session.lastReceived
                if silence >= timing.deadPeerTimeout {
                    actions += refuse(id, .timeout, "no frame for \(formatSeconds(silence.millisecondsDouble / 1000))", now: now)
                    continue
                }
                let (lastSent, pinging) = (session.lastSent, session.out.ping != nil)
                let (gossip, digest, ack, ping) = session.withLink { link in
                    let gossip = gossipRound && (link.gossipPending || link.changedSinceDigest)
                    if gossip { link.gossipPending = false }
                    let digest = link.changedSinceDigest && roundDue
                    let ack = digest && link.ackOwed
                    if digest { link.changedSinceDigest = false }
                    if ack { link.ackOwed = false }
                    var ping: UInt64?
                    if !digest, now - lastSent >= timing.keepaliveInterval, !pinging {
                        link.nextNonce += 1
                        ping = link.nextNonce
                    }
                    return (gossip, digest, ack, ping)
                } ?? (false, false, false, nil)
                if gossip {
                    session.out.gossipDue = true
                    actions.append(.wake(id))
                }
                if digest {
                    session.out.digestDue = true
                    if ack { session.out.ackDue = true }
                    actions.append(.wake(id))
                } else if let ping {
                    session.out.ping = ping
                    actions.append(.wake(id))
                }
                sessions[id] = session
            }
        }
        return actions + attachmentTick(now: now)
    }

    // MARK: - Outbound

    /// The next bytes for a session's transport (nil: nothing now). `skipped` reports fields too
    /// large for the peer's frames.
    mutating func nextBatch(_ id: SessionID, budget: Int, now: MonotonicInstant, state: some ReplicaView,
                            gossip: () -> [SeenReport]? = { nil }) -> (OutboundBatch?, [Action]) {
        // In place, never through a local copy of the session: what the batch adds to the
        // session's link (its delivered context) and takes from its queue would copy them.
        guard sessions[id] != nil else { return (nil, []) }
        var actions: [Action] = []
        sessions[id]?.takeDueRelay(now: now)
        if let out = sessions[id]?.out, !out.pendingDeltas.isEmpty || out.catchUp != nil || out.nextCatchUp != nil || out.resync {
            lastActivity = now
        }
        let (neighbors, localReplica, limits, timing, deflate) = (neighborList, settings.localReplica, settings.limits, settings.timing,
                                                                 settings.deflateChunks)
        let address = sessions[id]?.origin.address ?? ""
        let heldBefore = sessions[id]?.link?.deltasHeldUntil
        let batch = sessions[id]?.nextBatch(
            budget: budget, state: state, localReplica: localReplica, neighbors: neighbors, chunkTarget: limits.chunkTargetBytes,
            deflateChunks: deflate, now: now, coalescing: timing.deltaCoalescing, coalescingCount: timing.deltaCoalescingCount,
            gossip: gossip
        ) { key, field in
            actions.append(.log(CoreLog(.warning, "a field is too large for the peer's frames and is not sent to it",
                                        ["record": "\(key)", "field": field, "peer.address": address])))
        }
        // Deltas held back to share a frame: the writer is woken when they may go.
        if let until = sessions[id]?.link?.deltasHeldUntil, until != heldBefore { actions.append(.wakeAt(id, until)) }
        return (appendAttachmentFrames(id, to: batch, budget: budget, now: now), actions)
    }

    /// Whether the session has anything queued.
    func hasOutput(_ id: SessionID) -> Bool { sessions[id]?.out.hasWork ?? false }

    // MARK: - Status

    func peerStatuses() -> [(PeerInfo, lastConvergedAt: UInt64?, bytesSent: Int, bytesReceived: Int)] {
        established.values.sorted().compactMap { id in
            guard let session = sessions[id], let info = session.info else { return nil }
            return (info, session.lastConvergedAt, session.bytesSent, session.bytesReceived)
        }
    }

    func session(_ id: SessionID) -> PeerSession? { sessions[id] }

    func sessionMetadata(_ session: PeerSession, _ extra: [String: String]) -> [String: String] {
        var metadata = extra
        metadata["peer.address"] = session.origin.address
        if let peer = session.peer { metadata["peer.id"] = peer.replicaID.shortDescription }
        return metadata
    }
}
