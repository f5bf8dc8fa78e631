import PeerSyncCRDT
import PeerSyncModel
import PeerSyncWire

/// The compaction gossip (docs/PROTOCOL.md §19): what every replica has seen, so each can tell
/// which deletions are stable. Received `seen` messages and peers' acks become
/// ``ReplicationCore/Action/recordSeen(_:)``; the shell joins them into storage and, if that
/// grew the local gossip, calls ``ReplicationCore/gossipChanged(now:)`` — every session then
/// sends it with its next digest round. A session sends it only when it changed since the
/// last one to that peer, so an idle group sends none.
extension ReplicationCore {
    /// A `seen` message from the peer of session `id`.
    mutating func receiveSeen(_ id: SessionID, body: [UInt8], now: MonotonicInstant) -> [Action] {
        guard let session = sessions[id], session.phase == .established else {
            return refuse(id, .notAdmitted, "seen before admission", now: now)
        }
        do throws(WireError) {
            let seen = try SeenMessage.decode(body: body)
            sessions[id]!.peerStable = (session.peerStable ?? CausalContext()).merged(with: seen.stable)
            // Reports of replicas the roster does not know are kept until the roster says they
            // belong to a removed device or an older incarnation (the engine drops them then).
            return seen.reports.isEmpty && seen.stable.isEmpty ? [] : [.recordSeen(seen)]
        } catch {
            return refuse(id, .malformed, "\(error)", now: now)
        }
    }

    /// The peer of session `id` acked: its context is what it has seen (one report).
    func ackedForGossip(_ id: SessionID) -> [Action] {
        guard settings.seenGossip, let session = sessions[id], let peer = session.peer?.replicaID,
              let context = session.lastAckContext, !context.isEmpty else { return [] }
        var seen = SeenContexts()
        seen.record(peer, seen: context)
        return [.recordSeen(seen)]
    }

    /// The local gossip grew (storage joined something new): every established session that
    /// speaks it sends it with its next digest round.
    mutating func gossipChanged(now: MonotonicInstant) -> [Action] {
        for id in established.values where sessions[id]?.peer?.features.contains(.seenGossip) == true {
            sessions[id]!.gossipPending = true
        }
        return []
    }
}
