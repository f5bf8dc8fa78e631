import PeerSyncCRDT
import PeerSyncModel

/// What a ``SyncNode`` needs from the replica's storage. The engine supplies it (the session
/// layer never touches SQLite itself).
public protocol SyncStorage: Sendable {
    /// The replica's current state (a snapshot).
    func snapshot() -> ReplicaState
    /// Joins deltas received from a peer, durably, in one transaction; returns what changed.
    func applyRemote(_ deltas: [RecordMap], from peer: String) throws -> MergeOutcome
}

/// Something a node did that an app or a person may want to know.
public enum NodeEvent: Sendable {
    case listening(port: Int)
    case peerConnected(PeerInfo)
    case peerDisconnected(PeerInfo, reason: String)
    /// A connection attempt or handshake to `address` failed.
    case sessionRefused(address: String, reason: String)
    /// Catch-up from a peer: `chunk` of `chunks` applied, `records` in this chunk.
    case catchUpProgress(PeerInfo, chunk: Int, chunks: Int, records: Int)
    /// Digests are equal: this node and the peer hold the same state.
    case converged(PeerInfo, digest: StateDigest)
    /// A delta from a peer changed the local state.
    case remoteChange(MergeOutcome, from: PeerInfo)
}

/// A connected peer as this node sees it.
public struct PeerInfo: Sendable, Hashable {
    public let replicaID: ReplicaID
    public let name: String
    public let address: String
    /// Whether this node dialed the connection.
    public let dialed: Bool
}

/// A peer's connection state, for status displays.
public struct PeerStatus: Sendable {
    public let info: PeerInfo
    /// When digests were last found equal (wall-clock ms), if ever in this session.
    public let lastConvergedAt: UInt64?
    public let bytesSent: Int
    public let bytesReceived: Int
}

/// Bytes and frames that crossed a node's sockets (TLS records included).
public struct TrafficCounters: Sendable, Equatable {
    public var bytesSent = 0
    public var bytesReceived = 0
    public var framesSent = 0
    public var framesReceived = 0
    public init() {}
}
