@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncWire

/// What sync needs from the replica's storage. The engine supplies it (the replication layer
/// never touches SQLite itself).
///
/// One way in: the replicator ships to every peer exactly what ``followCommits()`` yields —
/// every commit that did not come from a peer, whoever made it (the app's saves, batches and
/// imports, the replicator's own admissions, other processes). Nothing else ships local
/// changes, so no commit can bypass it.
package protocol SyncStorage: Sendable {
    /// The replica's current committed state (a snapshot; cheap).
    func snapshot() -> ReplicaState
    /// Runs a local change durably in one transaction (e.g. writing an admitted device's roster
    /// entry); returns its delta, nil if nothing changed. It reaches peers through
    /// ``followCommits()`` like every other local commit.
    func commitLocal(_ body: (inout ReplicaState) throws -> RecordMap?) throws -> RecordMap?
    /// A new follower of the commits sync must ship, from now on (lossless: commits made while
    /// the follower is not asked are joined into one delta).
    func followCommits() -> any CommitFollower

    // Compaction gossip (docs/PROTOCOL.md §19; defaults below for a storage without it).

    /// The signed reports this replica gossips: every other replica's newest and its own last
    /// one; nil if this storage keeps no gossip (the node then does not announce it).
    func seenReports() -> [SeenReport]?
    /// Records reports from peers, already checked against the roster (a lost report only
    /// delays compaction). Reports of this store's own replica IDs that it did not sign mean it
    /// was put back from a backup: the storage recovers (new incarnation, writes since the
    /// restore moved) and says so. Called off the actor, in commit order.
    func recordSeen(_ reports: [SeenReport]) throws -> RecordedReports
    /// Stores a report this replica signed, durably, before it is sent.
    func saveOwnReport(_ report: SeenReport) throws
    /// Joins deltas received from peers — `origins[i]` sent `deltas[i]` — durably, in one
    /// transaction (all or none; journaled as from `journal`), and, for each complete round
    /// among them, drops the records the peer's group purged while this replica was in the past
    /// (PROTOCOL §6.5), in the same transaction. Returns what each delta changed, in order, and
    /// the records dropped. What peers sent is never yielded by ``followCommits()``.
    func applyRemote(_ deltas: [RecordMap], origins: [ChangeOrigin], journal: String, completing rounds: [CompleteRound]) throws
        -> (outcomes: [MergeOutcome], dropped: [RecordKey])

    // Attachment bytes (SyncStorage+Attachments.swift has defaults for a storage without them).
    // Called off the actor, on the replicator's attachment queue; may block on files.

    /// Whether this storage keeps attachment bytes (the node then announces it serves them).
    var storesAttachments: Bool { get }
    /// The largest attachment this replica fetches, by the synced setting of `state`.
    func attachmentMaxBytes(in state: ReplicaState) -> Int64
    /// Whether the complete bytes of `hash` are here, or how many bytes of them a partial file holds.
    func attachmentPresence(_ hash: AttachmentHash) -> AttachmentPresence
    /// Up to `length` bytes at `offset` of the complete bytes of `hash`, and their total size;
    /// nil if the complete bytes are not here.
    func readAttachment(_ hash: AttachmentHash, offset: Int64, length: Int) throws -> (bytes: [UInt8], total: Int64)?
    /// Writes `bytes` at `offset` of the partial file of `hash` (dropping anything after it).
    func writeAttachmentPartial(_ hash: AttachmentHash, offset: Int64, bytes: [UInt8]) throws
    /// Whether the complete partial file of `hash` hashes to `hash`.
    func verifyAttachmentPartial(_ hash: AttachmentHash) throws -> Bool
    /// Makes the verified partial file of `hash` durable under its final name.
    func promoteAttachmentPartial(_ hash: AttachmentHash) throws
    /// Deletes the partial file of `hash`, if any.
    func discardAttachmentPartial(_ hash: AttachmentHash)
}

extension SyncStorage {
    package func seenReports() -> [SeenReport]? { nil }
    package func recordSeen(_ reports: [SeenReport]) throws -> RecordedReports { RecordedReports() }
    package func saveOwnReport(_ report: SeenReport) throws {}
}

/// Follows a storage's commits for the replicator (``SyncStorage/followCommits()``).
package protocol CommitFollower: Sendable {
    /// Waits until a commit has landed since the last wait; false once cancelled. What it
    /// brought is taken with ``takePending()`` — by the replicator's actor itself, so that a
    /// delta is never in flight between the feed and the actor while a goodbye goes out.
    func waitForCommits() async -> Bool
    /// What is pending now, without waiting (nil: nothing).
    func takePending() -> OutgoingCommits?
    /// Ends the follower: ``waitForCommits()`` returns false.
    func cancel()
}

/// Commits to ship to peers, joined.
package struct OutgoingCommits: Sendable {
    /// The commits' deltas joined into one (nil: none).
    package var delta: RecordMap?
    /// Another process rewrote more than its journal keeps: offer every peer everything.
    package var resync: Bool

    package init(delta: RecordMap?, resync: Bool) {
        self.delta = delta
        self.resync = resync
    }
}

/// Thrown by a ``SyncStorage`` that refuses what a peer sent (it breaks a bound the store
/// enforces): the peer's fault, not the storage's.
package struct SyncStorageRefusal: Error, Sendable, CustomStringConvertible {
    public let detail: String
    public init(_ detail: String) { self.detail = detail }
    public var description: String { detail }
}

/// Names one session (a connection, or an app transport's session) within a node.
package struct SessionID: Hashable, Comparable, Sendable, CustomStringConvertible {
    public let rawValue: UInt64
    public init(_ rawValue: UInt64) { self.rawValue = rawValue }
    public static func < (lhs: SessionID, rhs: SessionID) -> Bool { lhs.rawValue < rhs.rawValue }
    public var description: String { "s\(rawValue)" }
}

/// How a session came to be.
package struct SessionOrigin: Sendable, Hashable {
    /// Where the peer is: `host:port` for TCP, the app's name for its own transports.
    public let address: String
    /// Whether this side opened it (dialed). Decides which of two sessions between the same
    /// pair survives.
    public let initiator: Bool
    /// The device the transport authenticated (the TLS certificate's key), if it did: the
    /// hello's device key must be the same.
    public let transportDevice: DeviceID?

    public init(address: String, initiator: Bool, transportDevice: DeviceID? = nil) {
        self.address = address
        self.initiator = initiator
        self.transportDevice = transportDevice
    }
}

/// Why a session ended, or why it never started.
public enum SessionEndReason: Sendable, Equatable, CustomStringConvertible {
    /// The peer said goodbye or sent an error frame.
    case peerClosed(CloseReason, detail: String)
    /// This node closed the session: the peer broke a rule or failed a check (detail says which).
    case refused(CloseReason, detail: String)
    /// The TLS handshake failed: another group's or a wrong key, or not a PeerSync node.
    case handshakeFailed(detail: String)
    /// The connection could not be opened.
    case unreachable(detail: String)
    /// The connection ended without a goodbye.
    case connectionLost(detail: String)
    /// Another session with the same peer was kept.
    case duplicate
    /// This node is shutting down, or sync was turned off.
    case localShutdown
    /// The local store could not persist what the peer sent.
    case storageFailed(detail: String)

    public var description: String {
        switch self {
        case .peerClosed(let reason, let detail): "peer closed the session (\(reason))" + (detail.isEmpty ? "" : ": \(detail)")
        case .refused(let reason, let detail): "refused (\(reason)): \(detail)"
        case .handshakeFailed(let detail): "TLS handshake failed (another group, a wrong key, or not a PeerSync node): \(detail)"
        case .unreachable(let detail): "cannot connect: \(detail)"
        case .connectionLost(let detail): "connection lost" + (detail.isEmpty ? "" : ": \(detail)")
        case .duplicate: "duplicate connection (another one to this peer is kept)"
        case .localShutdown: "shutting down"
        case .storageFailed(let detail): "local storage failed: \(detail)"
        }
    }
}

/// Something a node did that an app or a person may want to know.
package enum NodeEvent: Sendable {
    case listening(port: UInt16)
    case peerConnected(PeerInfo)
    case peerDisconnected(PeerInfo, reason: SessionEndReason)
    /// A connection attempt or handshake to `address` failed before the peer was known.
    case sessionRefused(address: String, reason: SessionEndReason)
    /// Catch-up from a peer: `chunk` of `chunks` received, `records` in this chunk.
    case catchUpProgress(PeerInfo, chunk: Int, chunks: Int, records: Int)
    /// Digests are equal: this node and the peer hold the same state.
    case converged(PeerInfo, digest: StateDigest)
    /// A delta from a peer changed the local state.
    case remoteChange(MergeOutcome, from: PeerInfo)
    /// The roster changed; `removedSelf` when this device itself is no longer active.
    case rosterChanged(Roster, removedSelf: Bool)
    /// This device's join completed: it is on the roster it received from its inviter.
    case joined(Roster)
    /// A peer's compaction gossip taught this replica something new about what the group has
    /// seen: compaction may be able to go further.
    case gossipReceived
    /// Digests differed although both sides held the same events (a bug here or in the peer's
    /// implementation): a full-state exchange with the peer repairs it. `repairs` counts them.
    case divergenceRepaired(PeerInfo, repairs: Int)
    /// Where a divergence was, from the peer's digest breakdown.
    case divergenceDetail(PeerInfo, collections: [String], writers: [ReplicaID])
    /// The digests still differ after this session's full-state repair, with equal contexts:
    /// the watchdog does not repair again (it would loop). `records`: records of the peer's
    /// repair round this replica did not take (echoes of records it purged), up to 100.
    case divergencePersists(PeerInfo, collections: [String], writers: [ReplicaID], records: [RecordKey])
    /// The peer knows writes in this replica's name up to `peerKnows`, beyond the `localHas` this
    /// store holds: the store was restored from an older copy. The session is refused; the owner
    /// should continue under a new replica ID (`ReplicaStore.beginNewIncarnation`), move the
    /// writes it made after `lostSince` (ms since 1970; the peer's newest knowledge of the lost
    /// future, when it told) to it, and resync.
    case restoredStoreDetected(PeerInfo, replica: ReplicaID, peerKnows: UInt64, localHas: UInt64, lostSince: UInt64?)
    /// A report signed by this store's lost future arrived (it was put back from a backup): the
    /// storage recovered — the writes made since the restore under `previous` moved to the
    /// current replica ID (`moved` events), and if `previous` was the current ID, the store
    /// continues under a new one. Every session ended; the owner restarts sync.
    case restoreRecovered(previous: ReplicaID, newIncarnation: Bool, moved: Int)
    /// Inbound connections were closed as soon as they were accepted: the node had
    /// ``SyncLimits/inboundConnections`` open (`overTotal`), or their address had
    /// ``SyncLimits/inboundConnectionsPerAddress`` (`overAddress`). Reported with a warning
    /// line at most once per 10 s, counting the refusals since the previous report.
    case connectionsRefused(overTotal: Int, overAddress: Int, lastAddress: String)
}

/// A connected peer as this node sees it.
package struct PeerInfo: Sendable, Hashable {
    public let replicaID: ReplicaID
    public let name: String
    public let address: String
    /// Whether this node opened the session.
    public let dialed: Bool
    /// The peer's device (authenticated), once known.
    public let deviceID: DeviceID?

    public init(replicaID: ReplicaID, name: String, address: String, dialed: Bool, deviceID: DeviceID? = nil) {
        self.replicaID = replicaID
        self.name = name
        self.address = address
        self.dialed = dialed
        self.deviceID = deviceID
    }
}

/// A peer's session state, for status displays.
public struct PeerStatus: Sendable {
    package let info: PeerInfo
    /// When digests were last found equal, if ever in this session.
    public let lastConvergedAt: Date?
    /// Framed bytes sent to and received from the peer in this session (TLS overhead excluded).
    public let bytesSent: Int
    public let bytesReceived: Int
}

/// Bytes and frames that crossed a node's sessions.
public struct TrafficCounters: Sendable, Equatable {
    /// Bytes on the sockets, TLS records included (TCP sessions only).
    public var bytesSent = 0
    public var bytesReceived = 0
    public var framesSent = 0
    public var framesReceived = 0
    /// Attachment bytes (payloads of `attachmentData` messages) sent and received.
    public var attachmentBytesSent = 0
    public var attachmentBytesReceived = 0
    /// Frame bytes sent by message type (`Message.Kind` raw value; TLS records not included),
    /// attachment frames left out: what ``bytesSent`` is made of.
    public var frameBytesSentByType: [UInt8: Int] = [:]
    public init() {}
}
