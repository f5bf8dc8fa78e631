import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncReplication
import PeerSyncNetwork
import PeerSyncStore

/// Lets sync (``Replicator``) read and write a ``ReplicaStore``: remote deltas commit in one
/// transaction each; attachment bytes live in the store's ``AttachmentStore``.
package struct StoreSyncStorage: SyncStorage {
    package let store: ReplicaStore
    /// The attachment directory beside the store.
    package let attachments: AttachmentStore
    /// The device key and group, to continue under a new replica ID when a report of this
    /// store's lost future arrives (nil: such a report is only logged by the node).
    let identity: (key: DeviceKey, group: GroupID)?

    /// Turns on the store's background checkpoints: a node keeps its store open and commits
    /// often, and a commit should not wait for a checkpoint. `key` and `groupID`: this device's,
    /// for recovering from a restore that a signed report reveals (``recordSeen(_:)``).
    package init(_ store: ReplicaStore, key: DeviceKey? = nil, groupID: GroupID? = nil) {
        store.checkpointsInBackground = true
        self.store = store
        attachments = AttachmentStore(storeDirectory: store.filesDirectory)
        identity = key.flatMap { key in groupID.map { (key, $0) } }
    }

    package func snapshot() -> ReplicaState { store.state }

    package func applyRemote(_ deltas: [RecordMap], origins: [ChangeOrigin], journal: String, completing rounds: [CompleteRound]) throws
        -> (outcomes: [MergeOutcome], dropped: [RecordKey])
    {
        do {
            return try store.applyRemoteEach(deltas, from: journal, origins: origins, bySync: true, completing: rounds)
        } catch .refused(_, let detail) {
            throw SyncStorageRefusal(detail)
        }
    }

    package func commitLocal(_ body: (inout ReplicaState) throws -> RecordMap?) throws -> RecordMap? {
        try store.write(body)
    }

    /// Follows the store's commit feed for what did not come from a peer.
    package func followCommits() -> any CommitFollower {
        StoreCommitFollower(store.commits.subscribe(CommitInterest(collections: [], outgoing: true)))
    }

    // MARK: - Compaction gossip

    package func seenReports() -> [SeenReport]? { store.seenReports() }

    /// Records the reports; one signed by this store's lost future (it was put back from a
    /// backup) makes it recover at once, before anything later is stored: the writes it made
    /// since the restore move to its current replica ID — a new one if the lost future's was
    /// the current one (docs/ARCHITECTURE.md, "Restores").
    package func recordSeen(_ reports: [SeenReport]) throws -> RecordedReports {
        var recorded = try store.recordSeen(reports)
        guard !recorded.fromLostFuture.isEmpty, let identity else { return recorded }
        var newest: [ReplicaID: SeenReport] = [:]
        for report in recorded.fromLostFuture where report.time >= newest[report.replica]?.time ?? 0 { newest[report.replica] = report }
        for (replica, report) in newest.sorted(by: { $0.key < $1.key }) {
            let recovery = try Replica.recoverFromRestore(
                store, key: identity.key, groupID: identity.group, lostReplica: replica, lostSince: report.time,
                reason: "a report this store did not sign shows it was restored from an older copy")
            if recovery.change != nil { recorded.leftIncarnation = replica }
            recorded.movedEvents += recovery.moved
            try store.acknowledgeLostFuture(report)
        }
        return recorded
    }

    package func saveOwnReport(_ report: SeenReport) throws { try store.saveOwnReport(report) }

    // MARK: - Attachments

    package var storesAttachments: Bool { true }

    /// The synced setting ``SettingKey/attachmentMaxBytes`` (``Replica/defaultAttachmentMaxBytes`` when unset).
    package func attachmentMaxBytes(in state: ReplicaState) -> Int64 {
        if case .int(let bytes)? = state.setting(SettingKey.attachmentMaxBytes, scope: .synced), bytes > 0 { return bytes }
        return Replica.defaultAttachmentMaxBytes
    }

    package func attachmentPresence(_ hash: AttachmentHash) -> AttachmentPresence {
        attachments.contains(hash) ? .stored : .partial(bytes: attachments.partialSize(of: hash) ?? 0)
    }

    package func readAttachment(_ hash: AttachmentHash, offset: Int64, length: Int) throws -> (bytes: [UInt8], total: Int64)? {
        guard let total = attachments.size(of: hash), offset >= 0, offset < total || total == 0,
              let data = try attachments.read(hash, offset: offset, length: length) else { return nil }
        return (Array(data), total)
    }

    package func writeAttachmentPartial(_ hash: AttachmentHash, offset: Int64, bytes: [UInt8]) throws {
        try attachments.writePartial(hash, offset: offset, bytes: bytes)
        store.commits.publishAttachmentsChanged()  // progress for observers of availability
    }

    package func verifyAttachmentPartial(_ hash: AttachmentHash) throws -> Bool {
        try attachments.verifyPartial(hash)
    }

    package func promoteAttachmentPartial(_ hash: AttachmentHash) throws {
        try attachments.promotePartial(hash)
        store.commits.publishAttachmentsChanged()
    }

    package func discardAttachmentPartial(_ hash: AttachmentHash) {
        attachments.discardPartial(hash)
        store.commits.publishAttachmentsChanged()
    }
}

/// The replicator's view of a store's commit feed: the deltas to ship, joined while it is busy.
private final class StoreCommitFollower: CommitFollower {
    private let subscription: CommitSubscription

    init(_ subscription: CommitSubscription) { self.subscription = subscription }

    func waitForCommits() async -> Bool { await subscription.waitForChanges() }

    func takePending() -> OutgoingCommits? {
        let pending = subscription.drain()
        guard pending.outgoing != nil || pending.resync else { return nil }
        return OutgoingCommits(delta: pending.outgoing, resync: pending.resync)
    }

    func cancel() { subscription.cancel() }
}
