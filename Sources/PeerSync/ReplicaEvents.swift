import PeerSyncCRDT
import PeerSyncSession

// What a replica reports to an app: its changes, its sync status and what stops it syncing.

/// A change to a replica's records, wherever it came from.
public struct ReplicaChange: Sendable {
    public enum Origin: Sendable, Equatable {
        /// Made through this `Replica`.
        case local
        /// Received from a peer.
        case peer(name: String, replicaID: ReplicaID)
        /// Committed by another process on the same store (e.g. the `peersync` command).
        case otherProcess
    }

    public let origin: Origin
    /// The records that changed (empty when another process rewrote so much that the replica
    /// reloaded: re-read everything).
    public let records: Set<RecordKey>
}

/// Where sync stands, for a status line in an app.
public enum SyncStatus: Sendable, Equatable {
    /// Sync is off: the replica works locally only.
    case disabled
    /// Sync is on, no peer connected yet (or all went away).
    case connecting
    /// Exchanging data; `progress` is the catch-up fraction when known.
    case syncing(progress: Double?)
    /// Every connected peer holds the same state as this replica.
    case inSync(lastSync: Date, peers: [String])
    /// Something a person can fix (wrong group, clock skew, port in use, storage).
    case error(SyncIssue)
}

/// What stops sync, in terms a person can act on.
public enum SyncIssue: Sendable, Equatable, CustomStringConvertible {
    /// A session to `address` failed or was refused, and no peer is connected.
    case session(address: String, reason: SessionEndReason)
    /// The local store cannot be read.
    case storage(String)
    /// This device was removed from the group by an admin: it can no longer sync.
    case removedFromGroup

    public var description: String {
        switch self {
        case .session(let address, let reason): "\(address): \(reason)"
        case .storage(let detail): "storage: \(detail)"
        case .removedFromGroup: "this device was removed from the group"
        }
    }
}
