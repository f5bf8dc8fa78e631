import PeerSyncCRDT
import PeerSyncWire
import Synchronization

/// The node's view of one connection: who the peer is, what it is known to have, and the
/// queue of what to send it. Shared between the node actor and the session's tasks.
final class SessionHandle: Sendable {
    let connectionID: UInt64
    let address: String
    let dialed: Bool
    let outbox = Outbox()
    let counter: ByteCounter
    let openedAt: UInt64

    private struct State {
        var peer: Hello?
        /// Dots the peer has: its hello, what it acked, what we wrote to it, what it sent us.
        var delivered = CausalContext()
        var lastReceived: UInt64
        var lastSent: UInt64
        var changedSinceDigest = true
        var lastConvergedAt: UInt64?
        var closeReason: String?
        var framesSent = 0
        var framesReceived = 0
        var pendingCatchUp: [RecordMap] = []
        var neighbors: Set<ReplicaID>?
        var pendingRecords = 0
    }

    private let state: Mutex<State>

    init(connectionID: UInt64, address: String, dialed: Bool, counter: ByteCounter, now: UInt64) {
        self.connectionID = connectionID
        self.address = address
        self.dialed = dialed
        self.counter = counter
        openedAt = now
        state = Mutex(State(lastReceived: now, lastSent: now))
    }

    var peer: Hello? { state.withLock { $0.peer } }

    var info: PeerInfo? {
        state.withLock { s in
            s.peer.map { PeerInfo(replicaID: $0.replicaID, name: $0.name, address: address, dialed: dialed) }
        }
    }

    func established(_ hello: Hello) {
        state.withLock {
            $0.peer = hello
            $0.delivered.merge(hello.context)
        }
    }

    var delivered: CausalContext { state.withLock { $0.delivered } }

    /// The replicas the peer has sessions with, as it last told us (nil: not known yet).
    var neighbors: Set<ReplicaID>? {
        get { state.withLock { $0.neighbors } }
        set { state.withLock { $0.neighbors = newValue } }
    }

    func noteDelivered(_ context: CausalContext) {
        if context.isEmpty { return }
        state.withLock { $0.delivered.merge(context) }
    }

    func noteReceived(now: UInt64) {
        state.withLock {
            $0.lastReceived = now
            $0.framesReceived += 1
        }
    }

    func noteSent(now: UInt64) {
        state.withLock {
            $0.lastSent = now
            $0.framesSent += 1
        }
    }

    func noteChanged() { state.withLock { $0.changedSinceDigest = true } }

    /// Whether a digest is due: something changed and the session has been quiet for `quiet` ms.
    func takeDigestDue(now: UInt64, quiet: UInt64) -> Bool {
        state.withLock { s in
            guard s.peer != nil, s.changedSinceDigest, now - max(s.lastReceived, s.lastSent) >= quiet else { return false }
            s.changedSinceDigest = false
            return true
        }
    }

    func noteConverged(now: UInt64) { state.withLock { $0.lastConvergedAt = now } }
    var lastConvergedAt: UInt64? { state.withLock { $0.lastConvergedAt } }

    func silence(now: UInt64) -> (received: UInt64, sent: UInt64) {
        state.withLock { (now &- $0.lastReceived, now &- $0.lastSent) }
    }

    /// Records why the session ends (first reason wins).
    func setCloseReason(_ reason: String) {
        state.withLock { if $0.closeReason == nil { $0.closeReason = reason } }
    }

    var closeReason: String? { state.withLock { $0.closeReason } }

    var frames: (sent: Int, received: Int) { state.withLock { ($0.framesSent, $0.framesReceived) } }

    /// Adds a received catch-up chunk to the batch waiting for one transaction; returns the
    /// batch when it is due (`flush`, or `limit` records reached).
    func batchCatchUp(_ chunk: RecordMap, flush: Bool, limit: Int) -> [RecordMap]? {
        state.withLock { s in
            s.pendingCatchUp.append(chunk)
            s.pendingRecords += chunk.recordCount
            guard flush || s.pendingRecords >= limit else { return nil }
            defer {
                s.pendingCatchUp = []
                s.pendingRecords = 0
            }
            return s.pendingCatchUp
        }
    }
}
