import PeerSyncReplication
/// What a node's limits (``SyncLimits``) have refused so far, and its dialing now.
public struct LimitStatus: Sendable, Equatable, Codable {
    /// Inbound connections closed on arrival because the node had
    /// ``SyncLimits/inboundConnections`` open.
    public var refusedOverTotal = 0
    /// Inbound connections closed on arrival because their address had
    /// ``SyncLimits/inboundConnectionsPerAddress`` open.
    public var refusedOverAddress = 0
    /// Inbound connections open now.
    public var inboundOpen = 0
    /// Addresses the node dials: static peers and discovered ones.
    public var dialTargets = 0
    /// Connection attempts running now (at most ``SyncLimits/concurrentDials``).
    public var dialing = 0
    /// The most connection attempts that ran at once.
    public var dialingPeak = 0
    /// Addresses whose sessions failed to authenticate or were refused, redialed with
    /// ``SyncLimits/rejectedDialBackoff``.
    public var rejectedTargets = 0
    /// Connection attempts made so far.
    public var dialAttempts = 0

    public init(refusedOverTotal: Int = 0, refusedOverAddress: Int = 0, inboundOpen: Int = 0, dialTargets: Int = 0,
                dialing: Int = 0, dialingPeak: Int = 0, rejectedTargets: Int = 0, dialAttempts: Int = 0) {
        self.refusedOverTotal = refusedOverTotal
        self.refusedOverAddress = refusedOverAddress
        self.inboundOpen = inboundOpen
        self.dialTargets = dialTargets
        self.dialing = dialing
        self.dialingPeak = dialingPeak
        self.rejectedTargets = rejectedTargets
        self.dialAttempts = dialAttempts
    }
}
