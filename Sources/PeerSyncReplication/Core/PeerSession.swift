@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncWire

/// A point on the monotonic clock; every liveness and keepalive decision uses it.
package typealias MonotonicInstant = ContinuousClock.Instant

/// One session as the replication core sees it: its phase (``State``, with the data that exists
/// only in that phase), the inbound rules (``SessionStateMachine``), timers, traffic counters and
/// what remains to be sent. A value type with no I/O; ``ReplicationCore`` owns one per session.
struct PeerSession {
    /// The session's phase (PROTOCOL §6.1), carrying what exists only from that phase on: the
    /// peer's hello and key once its hello is read, the ``Link`` once it is admitted. A field of
    /// a later phase cannot be read in an earlier one.
    enum State {
        case awaitingHello
        /// The peer's hello passed; waiting for its auth (proof that it holds its device key).
        case authenticating(Handshake)
        /// An authenticated device unknown to the roster; waiting for its join entry.
        case joining(Handshake)
        case established(Handshake, Link)
        /// A last message (goodbye or error) is queued or being flushed; nothing more is read.
        case closing(Closing)
    }

    /// The phase alone, without its data: what the frame rules (``SessionStateMachine/rule(for:in:)``)
    /// and the timer decide by.
    enum Phase: Equatable {
        case awaitingHello, authenticating, joining, established, closing
    }

    /// What the peer's hello and auth told: from its hello on, in every later phase.
    struct Handshake {
        let hello: Hello
        /// The peer's device key, from its hello (nil only while the hello's own checks run, in
        /// the frame that brought it, and in a session refused by them).
        var key: DevicePublicKey?
        /// The peer's auth said this store was restored: the newest time it knows of its lost future.
        var lostSince: UInt64?
    }

    /// What an admitted session tracks: what the peer is known to have, acks and digests, the
    /// compaction gossip, relays, coalescing, the watchdog, catch-up chunks being received.
    struct Link {
        /// The peer's frame limit (its hello's `maxFrameBytes`).
        let maxFrame: Int
        /// Dots the peer has: its hello, what it acked, what was sent to it, what it sent.
        var delivered: CausalContext
        /// The replicas the peer has sessions with, as it last said (nil: not known yet).
        var neighbors: Set<ReplicaID>?
        var changedSinceDigest = true
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
        /// Received catch-up chunks waiting to be committed together.
        var batch: [RecordMap] = []
        var batchBytes = 0
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
        /// Records of other peers' catch-up rounds are owed to this peer at this instant (as a
        /// round of what it lacks), unless by then its neighbours cover ``relayWriters``.
        var relayDue: MonotonicInstant?
        /// The replicas that wrote the records owed (PROTOCOL §6.6).
        var relayWriters: Set<ReplicaID> = []
        var nextNonce: UInt64 = 0

        init(maxFrame: Int, delivered: CausalContext) {
            self.maxFrame = maxFrame
            self.delivered = delivered
        }
    }

    /// A session ending: since when, and what it had got to (its queued frames may still flush).
    struct Closing {
        var since: MonotonicInstant
        /// Nil if the session closed before the peer's hello was read.
        let handshake: Handshake?
        /// Nil if the session closed before admission.
        var link: Link?
    }

    let id: SessionID
    let origin: SessionOrigin
    /// The nonce of this side's hello (the peer signs it).
    let nonce: [UInt8]
    var state = State.awaitingHello
    var machine: SessionStateMachine
    /// Dictionary for what this side sends; starts at this side's hello wall clock.
    let outbound: WireDictionary
    var out = OutboundQueue()
    var openedAt: MonotonicInstant
    var lastReceived: MonotonicInstant
    var lastSent: MonotonicInstant
    /// Wall-clock ms when digests were last equal.
    var lastConvergedAt: UInt64?
    var endReason: SessionEndReason?
    /// `peerConnected` was reported for this session.
    var announced = false
    /// The peer's hello showed events this replica lacks and its first round (what it sends on
    /// admission) has not ended yet: rounds queued meanwhile may wait for it (group commit).
    var firstRoundPending = false
    var framesSent = 0
    var framesReceived = 0
    var bytesSent = 0
    /// Frame bytes sent, by message type (TLS not included): what the traffic is made of.
    var frameBytesSentByType: [UInt8: Int] = [:]
    var bytesReceived = 0

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

    var phase: Phase {
        switch state {
        case .awaitingHello: .awaitingHello
        case .authenticating: .authenticating
        case .joining: .joining
        case .established: .established
        case .closing: .closing
        }
    }

    var handshake: Handshake? {
        switch state {
        case .awaitingHello: nil
        case .authenticating(let handshake), .joining(let handshake), .established(let handshake, _): handshake
        case .closing(let closing): closing.handshake
        }
    }

    /// The peer's hello, once read.
    var peer: Hello? { handshake?.hello }
    var peerKey: DevicePublicKey? { handshake?.key }

    /// The link of an admitted session (established, or closing after it was).
    var link: Link? {
        switch state {
        case .established(_, let link): link
        case .closing(let closing): closing.link
        default: nil
        }
    }

    /// Whether the peer gets records by each of `writers` from the writer itself: it is the
    /// writer, or a neighbour its last ack named.
    func hearsDirectly(from writers: Set<ReplicaID>) -> Bool {
        guard let peer = peer?.replicaID else { return false }
        let neighbors = link?.neighbors
        return writers.allSatisfy { $0 == peer || (neighbors?.contains($0) ?? false) }
    }

    /// A relay that is due at `now` becomes a catch-up round of what the peer lacks, unless
    /// the peer now hears every writer directly. Live deltas queued for the peer make it due at
    /// once: they may be writes of a replica whose claim (a roster record) is among the records
    /// owed, and the peer refuses writes by replicas it does not know to be claimed — a round
    /// sends roster records first, and the deltas join it.
    mutating func takeDueRelay(now: MonotonicInstant) {
        guard let due = link?.relayDue, now >= due || !out.pendingDeltas.isEmpty else { return }
        let writers = withLink { link -> Set<ReplicaID> in
            link.relayDue = nil
            defer { link.relayWriters = [] }
            return link.relayWriters
        } ?? []
        if phase == .established, !hearsDirectly(from: writers) { out.resync = true }
    }

    /// The node's timer ran `stall` late (its process starved or suspended): that long is not
    /// the peer's silence, nor the handshake's or the closing's.
    mutating func postpone(by stall: Duration, until now: MonotonicInstant) {
        lastReceived = min(now, lastReceived + stall)
        openedAt = min(now, openedAt + stall)
        if case .closing(var closing) = state {
            closing.since = min(now, closing.since + stall)
            state = .closing(closing)
        }
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
        state = .closing(Closing(since: now, handshake: handshake, link: link))
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

extension PeerSession {
    /// Takes the link out of `state` for work on it beside the session's other fields, in place
    /// (meanwhile an established session reads as authenticating); ``putLink(_:)`` puts it back.
    mutating func takeLink() -> Link? {
        switch state {
        case .established(let handshake, let link):
            state = .authenticating(handshake)  // `link` now holds the only reference to its storage
            return link
        case .closing(var closing):
            guard let link = closing.link else { return nil }
            closing.link = nil
            state = .closing(closing)
            return link
        default:
            return nil
        }
    }

    /// Puts back the link ``takeLink()`` took.
    mutating func putLink(_ link: Link) {
        switch state {
        case .authenticating(let handshake): state = .established(handshake, link)
        case .closing(var closing):
            closing.link = link
            state = .closing(closing)
        default: assertionFailure("putLink(_:) without takeLink()")
        }
    }

    /// Runs `body` on the link of an admitted session (established, or closing after it was) in
    /// place; nil, and nothing runs, before admission. Never on a copy: a copy alive while a chunk
    /// is appended to the batch would make every append copy the whole batch (a 100k-record
    /// round took minutes), and one of `delivered` would copy the context per delta sent.
    @discardableResult
    mutating func withLink<R>(_ body: (inout Link) -> R) -> R? {
        guard var link = takeLink() else { return nil }
        defer { putLink(link) }
        return body(&link)
    }
}
