import Foundation
import PeerSyncCRDT
import PeerSyncModel
import PeerSyncSession
import PeerSyncStore

/// Lets sync (``Replicator``) read and write a ``ReplicaStore``: remote deltas commit in one
/// transaction each; attachment bytes live in the store's ``AttachmentStore``.
public struct StoreSyncStorage: SyncStorage {
    public let store: ReplicaStore
    /// The attachment directory beside the store.
    public let attachments: AttachmentStore

    /// Turns on the store's background checkpoints: a node keeps its store open and commits
    /// often, and a commit should not wait for a checkpoint.
    public init(_ store: ReplicaStore) {
        store.checkpointsInBackground = true
        self.store = store
        attachments = AttachmentStore(storeDirectory: store.directory)
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

    // MARK: - Compaction gossip

    public func seenGossip() -> SeenContexts? { store.seenGossip() }

    public func recordSeen(_ gossip: SeenContexts) throws -> Bool {
        try store.recordSeen(gossip, now: UInt64(max(0, Date().timeIntervalSince1970 * 1_000)))
    }

    // MARK: - Attachments

    public var storesAttachments: Bool { true }

    /// The synced setting ``SettingKey/attachmentMaxBytes`` (``Replica/defaultAttachmentMaxBytes`` when unset).
    public func attachmentMaxBytes(in state: ReplicaState) -> Int64 {
        if case .int(let bytes)? = state.setting(SettingKey.attachmentMaxBytes, scope: .synced), bytes > 0 { return bytes }
        return Replica.defaultAttachmentMaxBytes
    }

    public func attachmentPresence(_ hash: AttachmentHash) -> AttachmentPresence {
        attachments.contains(hash) ? .stored : .partial(bytes: attachments.partialSize(of: hash) ?? 0)
    }

    public func readAttachment(_ hash: AttachmentHash, offset: Int64, length: Int) throws -> (bytes: [UInt8], total: Int64)? {
        guard let total = attachments.size(of: hash), offset >= 0, offset < total || total == 0,
              let data = try attachments.read(hash, offset: offset, length: length) else { return nil }
        return (Array(data), total)
    }

    public func writeAttachmentPartial(_ hash: AttachmentHash, offset: Int64, bytes: [UInt8]) throws {
        try attachments.writePartial(hash, offset: offset, bytes: bytes)
    }

    public func verifyAttachmentPartial(_ hash: AttachmentHash) throws -> Bool {
        try attachments.verifyPartial(hash)
    }

    public func promoteAttachmentPartial(_ hash: AttachmentHash) throws {
        try attachments.promotePartial(hash)
    }

    public func discardAttachmentPartial(_ hash: AttachmentHash) {
        attachments.discardPartial(hash)
    }
}
