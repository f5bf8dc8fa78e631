import PeerSyncCRDT
import PeerSyncModel
import PeerSyncSession
import PeerSyncStore

/// Lets sync (``Replicator``) read and write a ``ReplicaStore``: remote deltas commit in one
/// transaction each.
public struct StoreSyncStorage: SyncStorage {
    public let store: ReplicaStore

    public init(_ store: ReplicaStore) {
        self.store = store
    }

    public func snapshot() -> ReplicaState { store.state }

    public func applyRemote(_ deltas: [RecordMap], from origin: String) throws -> [MergeOutcome] {
        do {
            return try store.applyRemoteEach(deltas, from: origin)
        } catch .refused(_, let detail) {
            throw SyncStorageRefusal(detail)
        }
    }

    public func commitLocal(_ body: (inout ReplicaState) throws -> RecordMap?) throws -> RecordMap? {
        try store.write(body)
    }
}
