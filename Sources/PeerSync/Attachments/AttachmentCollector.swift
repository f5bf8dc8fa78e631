import Foundation
import Logging
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import PeerSyncStore
import Synchronization

/// Knows which attachments live records reference, and deletes the bytes of those no live
/// record references any more.
///
/// It indexes every visible record's attachments once (O(records)), then follows the store's
/// commit feed and looks only at the records each commit touched: an attachment whose last
/// reference goes away is deleted at once if its file is older than the grace period (a file
/// just added is usually about to be referenced by the record being saved).
///
/// Commits that come close together are looked at together, against the state after the last
/// of them: a reference saved and dropped again in between never shows. So the attachments
/// added through this replica are tracked until a live record references them
/// (``added(_:)``); one still unreferenced after a commit is deleted as if its last reference
/// went away (once older than the grace period; until then it is looked at after every commit).
final class AttachmentCollector: Sendable {
    let files: AttachmentStore
    private let store: ReplicaStore
    private let logger: Logger

    private struct State {
        var byRecord: [RecordKey: Set<Attachment>] = [:]
        var counts: [AttachmentHash: Int] = [:]
        var attachments: [AttachmentHash: Attachment] = [:]
        var task: Task<Void, Never>?
        var gracePeriod: Duration = .seconds(600)
        var purged = 0
        /// Added through this replica (when), not referenced by a live record yet.
        var unclaimed: [AttachmentHash: ContinuousClock.Instant] = [:]
    }
    private let state = Mutex(State())

    init(store: ReplicaStore, logger: Logger) {
        self.store = store
        files = AttachmentStore(storeDirectory: store.filesDirectory)
        self.logger = logger
    }

    var gracePeriod: Duration {
        get { state.withLock { $0.gracePeriod } }
        set { state.withLock { $0.gracePeriod = newValue } }
    }

    /// How many attachments the collector deleted after commits (for tests and diagnostics).
    var purgedAfterCommits: Int { state.withLock { $0.purged } }

    /// `hash` was just added through this replica: it goes after a commit once no live record
    /// references it and its file is older than the grace period (see the type's comment).
    func added(_ hash: AttachmentHash) {
        state.withLock { s in
            if s.counts[hash] == nil { s.unclaimed[hash] = .now }
        }
    }

    /// Forgets the unclaimed hashes a live record now references; returns those added longer
    /// than the grace period ago (their files' ages are checked again before deleting).
    private func unclaimedDue(now: ContinuousClock.Instant) -> Set<AttachmentHash> {
        state.withLock { s in
            guard !s.unclaimed.isEmpty else { return [] }
            s.unclaimed = s.unclaimed.filter { s.counts[$0.key] == nil }
            let grace = s.gracePeriod
            return Set(s.unclaimed.filter { now - $0.value >= grace }.keys)
        }
    }

    /// Indexes the current state and starts following commits.
    func start() {
        let subscription = store.commits.subscribe(CommitInterest(collections: nil))
        let (snapshot, sequence) = store.consistentSnapshot()
        let pending = subscription.drain()
        if pending.newestSequence > sequence { subscription.requeue(pending) }
        state.withLock { s in
            s.byRecord = [:]
            s.counts = [:]
            s.attachments = [:]
            for (key, raw) in snapshot.records.allRecords where raw.isVisible {
                let found = Attachment.referenced(in: raw.values)
                if !found.isEmpty { Self.set(key, found, in: &s) }
            }
        }
        let task = Task.detached { [weak self, store] in
            while await subscription.waitForChanges() {
                let (snapshot, sequence) = store.consistentSnapshot()
                let pending = subscription.drain()
                guard let self else { return }
                let unreferenced = self.apply(pending, snapshot)
                if pending.newestSequence > sequence { subscription.requeue(pending) }
                let due = self.unclaimedDue(now: .now)
                let candidates = due.isEmpty ? unreferenced : Array(due.union(unreferenced)).sorted()
                if !candidates.isEmpty { self.delete(candidates) }
            }
        }
        state.withLock { $0.task = task }
    }

    func stop() {
        state.withLock { $0.task?.cancel() }
    }

    deinit { stop() }

    /// Updates the index from the records `changes` touched; returns the hashes that lost
    /// their last reference.
    private func apply(_ changes: PendingChanges, _ snapshot: ReplicaState) -> [AttachmentHash] {
        state.withLock { s in
            var dropped: Set<AttachmentHash> = []
            if changes.reload {
                let before = Set(s.counts.keys)
                s.byRecord = [:]
                s.counts = [:]
                s.attachments = [:]
                for (key, raw) in snapshot.records.allRecords where raw.isVisible {
                    let found = Attachment.referenced(in: raw.values)
                    if !found.isEmpty { Self.set(key, found, in: &s) }
                }
                dropped = before.subtracting(s.counts.keys)
            } else {
                for key in changes.keys {
                    let raw = snapshot.records.record(key)
                    let found = raw.map { $0.isVisible ? Attachment.referenced(in: $0.values) : [] } ?? []
                    dropped.formUnion(Self.set(key, found, in: &s))
                }
            }
            return dropped.filter { s.counts[$0] == nil }.sorted()
        }
    }

    /// Makes `found` the attachments of `key`; returns hashes whose count fell to zero.
    @discardableResult
    private static func set(_ key: RecordKey, _ found: Set<Attachment>, in s: inout State) -> [AttachmentHash] {
        let old = s.byRecord[key] ?? []
        guard old != found else { return [] }
        var dropped: [AttachmentHash] = []
        for attachment in old.subtracting(found) {
            let hash = attachment.contentHash
            s.counts[hash, default: 1] -= 1
            if s.counts[hash]! <= 0 {
                s.counts[hash] = nil
                s.attachments[hash] = nil
                dropped.append(hash)
            }
        }
        for attachment in found.subtracting(old) {
            s.counts[attachment.contentHash, default: 0] += 1
            s.attachments[attachment.contentHash] = attachment
        }
        s.byRecord[key] = found.isEmpty ? nil : found
        return dropped
    }

    /// Deletes the bytes of `hashes` that are still unreferenced and older than the grace period.
    private func delete(_ hashes: [AttachmentHash]) {
        let grace = gracePeriod
        for hash in hashes where !isReferenced(hash) {
            guard isOlder(files.modificationDate(of: hash) ?? files.partialModificationDate(of: hash), than: grace) else { continue }
            let removed = files.remove(hash)
            state.withLock { s in
                s.unclaimed[hash] = nil
                if removed { s.purged += 1 }
            }
            if removed {
                logger.debug("deleted an attachment no live record references", metadata: ["attachment.hash": "\(hash.hex)"])
                store.commits.publishAttachmentsChanged()
            }
        }
    }

    private func isOlder(_ date: Date?, than grace: Duration) -> Bool {
        guard let date else { return true }
        let seconds = Double(grace.components.seconds) + Double(grace.components.attoseconds) / 1e18
        return Date().timeIntervalSince(date) >= seconds
    }

    /// Whether some live record references `hash` (as of the last commit looked at).
    func isReferenced(_ hash: AttachmentHash) -> Bool {
        state.withLock { $0.counts[hash] != nil }
    }

    /// Every attachment live records reference (as of the last commit looked at).
    func referencedAttachments() -> [Attachment] {
        state.withLock { Array($0.attachments.values) }.sorted { $0.contentHash < $1.contentHash }
    }

    /// A full sweep: deletes every stored, partial or temporary file that no visible record of
    /// the current state references and that is older than `grace`. Returns the hashes deleted.
    func purge(olderThan grace: Duration) -> [AttachmentHash] {
        let snapshot = store.state
        var live: Set<AttachmentHash> = []
        for (_, raw) in snapshot.records.allRecords where raw.isVisible {
            for attachment in Attachment.referenced(in: raw.values) { live.insert(attachment.contentHash) }
        }
        var deleted: [AttachmentHash] = []
        for hash in files.storedHashes() where !live.contains(hash) && !isReferenced(hash) {
            if isOlder(files.modificationDate(of: hash), than: grace), files.remove(hash) { deleted.append(hash) }
        }
        for hash in files.partialFiles().keys where !live.contains(hash) && !isReferenced(hash) {
            if isOlder(files.partialModificationDate(of: hash), than: grace) { files.discardPartial(hash) }
        }
        for leftover in files.leftoverTemporaryFiles() where isOlder(leftover.modified, than: grace) {
            try? FileManager.default.removeItem(atPath: leftover.path)
        }
        if !deleted.isEmpty { store.commits.publishAttachmentsChanged() }
        return deleted
    }
}
