@_spi(Engine) import PeerSyncCRDT

/// Where a committed change to a replica came from (``ReplicaChange/origin``; the store's commit
/// feed tags each change with it).
public enum ChangeOrigin: Sendable, Hashable {
    /// Made through this process's replica: its saves, deletes, batches, settings, imports and
    /// the roster entries it signs.
    case local
    /// Received from a peer: by sync, or in a bundle this replica imported.
    case peer(name: String, replicaID: ReplicaID)
    /// Committed by another process on the same store (e.g. the `peersync` command).
    case otherProcess
}
