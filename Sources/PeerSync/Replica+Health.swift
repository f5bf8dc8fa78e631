import PeerSyncReplication
import PeerSyncNetwork

/// How sync copes, beyond ``SyncStatus``: the convergence watchdog's repairs and what the
/// node's limits (``SyncLimits``) refused. Counts start at zero with each ``Replica/startSync(_:)``.
public struct SyncHealth: Sendable, Equatable {
    /// Full-state repairs by the convergence watchdog: after both sides acked, their digests
    /// differed although they held the same events (a bug here or in a peer's implementation).
    /// Each is also logged as a warning naming the collections and writers that differed.
    public var repairs = 0
    /// Sessions refused because the node had ``SyncLimits/sessions`` established.
    public var refusedSessions = 0
    /// Connections refused by the inbound limits, and the dialing now (zeros without TCP).
    public var limits = LimitStatus()
    /// Peers whose digests still differed after a repair (the watchdog then stops repairing
    /// that session and says so here, once): a divergence a repair cannot heal.
    public var divergences: [Divergence] = []

    /// A divergence the watchdog's repair did not heal.
    public struct Divergence: Sendable, Equatable {
        /// The peer's replica ID (short form) and name.
        public var peer: String
        public var peerName: String
        /// Collections and writers whose parts of the digest differ (from the peer's breakdown).
        public var collections: [String]
        public var writers: [String]
        /// Records of the peer's rounds this replica did not take (echoes of records it purged).
        public var records: [String]

        public init(peer: String, peerName: String, collections: [String], writers: [String], records: [String]) {
            self.peer = peer
            self.peerName = peerName
            self.collections = collections
            self.writers = writers
            self.records = records
        }
    }

    /// The relays sync dials (``SyncConfiguration/relays``), each with what it withholds past
    /// the bound ("writer W's counters n–m") and the blobs from it that were refused.
    public var relays: [RelayStatus] = []

    public init(repairs: Int = 0, refusedSessions: Int = 0, limits: LimitStatus = LimitStatus(), divergences: [Divergence] = [],
                relays: [RelayStatus] = []) {
        self.repairs = repairs
        self.refusedSessions = refusedSessions
        self.limits = limits
        self.divergences = divergences
        self.relays = relays
    }
}

extension Replica {
    /// The health of sync now (zeros with sync off).
    public func syncHealth() async -> SyncHealth {
        SyncHealth(repairs: repairs, refusedSessions: refusedSessions, limits: await currentNode?.limitStatus() ?? LimitStatus(),
                   divergences: divergences.values.sorted { $0.peer < $1.peer }, relays: await relayStatus())
    }

    /// The health now, and again whenever the watchdog repairs a divergence or a limit refuses
    /// sessions or connections (connection refusals are reported at most once per 10 s). Each
    /// call makes a new subscriber.
    public nonisolated func healthUpdates() -> AsyncStream<SyncHealth> {
        let stream = healthSubscribers.subscribe()
        Task { await self.publishHealth() }
        return stream
    }

    func publishHealth() async {
        healthSubscribers.yield(await syncHealth())
    }
}
