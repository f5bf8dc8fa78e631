@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import Synchronization

/// Tells subscribers, synchronously and in commit order, what each state change of a store
/// touched. The store calls it while it still holds its lock, so a snapshot read afterwards
/// (``ReplicaStore/consistentSnapshot()``) never includes a change whose notice is not yet
/// queued. Publishing costs O(subscribers): notices are queued, and each subscriber filters
/// them on its own task when it drains.
package final class CommitFeed: Sendable {
    private struct State {
        var sequence: UInt64 = 0
        var nextID = 0
        /// Weak: a subscription ends when its owner drops it (its deinit unsubscribes).
        var subscribers: [Int: WeakSubscription] = [:]
        var localSettings: [String: FieldValue]?
        var conflictsRecorded: Int?
    }
    private let state = Mutex(State())

    /// A feed with no subscribers (each store makes its own).
    public init() {}

    /// The sequence number of the newest state change published.
    public var sequence: UInt64 { state.withLock { $0.sequence } }

    /// A new subscription; it sees every change published from now on.
    public func subscribe(_ interest: CommitInterest) -> CommitSubscription {
        state.withLock { s in
            let subscription = CommitSubscription(id: s.nextID, interest: interest, feed: self)
            s.subscribers[s.nextID] = WeakSubscription(subscription: subscription)
            s.nextID += 1
            return subscription
        }
    }

    func remove(_ id: Int) {
        _ = state.withLock { $0.subscribers.removeValue(forKey: id) }
    }

    /// Called by the store under its lock after `state` became the published state: `absorbed`
    /// are other processes' commits joined first (or this process's own rewrites, a `nil`
    /// delta: re-read everything), `deltas` this change's own deltas and `origins` theirs, in
    /// order (nil: all ``ChangeOrigin/local``). `shipDeltas`: false when sync itself committed
    /// `deltas` (received from peers: the replicator has passed them on already).
    func publish(state replicaState: ReplicaState, absorbed: [StoreChange], deltas: [RecordMap], origins: [ChangeOrigin]? = nil,
                 shipDeltas: Bool = true) {
        var byOrigin: [ChangeOrigin: Set<RecordKey>] = [:]
        var reloadOrigin: ChangeOrigin?
        var outgoing: [RecordMap] = []
        var resync = false
        // Without subscribers, only count; without one that wants keys, name none (a subscriber
        // that arrives meanwhile reads a snapshot that includes this change anyway).
        let (listened, keysWanted) = state.withLock { s -> (Bool, Bool) in
            var listened = false
            for each in s.subscribers.values {
                guard let subscription = each.subscription else { continue }
                listened = true
                if subscription.interest.wantsKeys { return (true, true) }
            }
            return (listened, false)
        }
        func add(_ delta: RecordMap, from origin: ChangeOrigin, ship: Bool) {
            if keysWanted {
                var keys = byOrigin.removeValue(forKey: origin) ?? []
                for (collection, records) in delta.collections {
                    for id in records.keys { keys.insert(RecordKey(collection: collection, id: id)) }
                }
                byOrigin[origin] = keys
            }
            if ship { outgoing.append(delta) }
        }
        for change in absorbed where listened {
            guard let delta = change.delta else {
                // Another process's change too large for the journal, or this process's own
                // rewrite (a purge, compaction, a restore's drop: nothing for peers).
                let external = change.origin == "reload"
                reloadOrigin = external ? .otherProcess : .local
                resync = resync || external
                continue
            }
            add(delta, from: .otherProcess, ship: true)
        }
        if listened {
            for (index, delta) in deltas.enumerated() {
                add(delta, from: origins.map { index < $0.count ? $0[index] : .local } ?? .local, ship: shipDeltas)
            }
        }
        let reload = reloadOrigin != nil
        var keys: Set<RecordKey> = []
        if !reload {
            if byOrigin.count == 1 { keys = byOrigin.first!.value } else { for each in byOrigin.values { keys.formUnion(each) } }
        } else {
            byOrigin = [:]
        }
        let (notice, subscribers) = state.withLock { s in
            let local = s.localSettings.map { $0 != replicaState.localSettings } ?? true
            let conflicts = s.conflictsRecorded.map { $0 != replicaState.conflicts.totalRecorded } ?? true
            s.localSettings = replicaState.localSettings
            s.conflictsRecorded = replicaState.conflicts.totalRecorded
            s.sequence += 1
            let notice = CommitNotice(sequence: s.sequence, keys: keys, reload: reload,
                                      localSettingsChanged: local, conflictsChanged: conflicts, origins: byOrigin,
                                      reloadOrigin: reloadOrigin, outgoing: outgoing, resync: resync)
            guard reload || !keys.isEmpty || local || conflicts || !outgoing.isEmpty else { return (notice, [CommitSubscription]()) }
            return (notice, s.subscribers.values.compactMap(\.subscription))
        }
        // Outside the feed's lock (a subscription whose owner let go meanwhile may deinit here
        // and unsubscribe), but still under the store's, so the notice is queued before anyone
        // can read the new state.
        for subscriber in subscribers { subscriber.enqueue(notice) }
    }

    /// Tells subscribers interested in attachments that attachment files changed (bytes arrived
    /// or completed, a file added or deleted). Not a state change: the sequence does not move.
    public func publishAttachmentsChanged() {
        let (notice, subscribers) = state.withLock { s in
            let notice = CommitNotice(sequence: s.sequence, keys: [], reload: false, localSettingsChanged: false,
                                      conflictsChanged: false, origins: [:], reloadOrigin: nil, outgoing: [], resync: false,
                                      attachmentsChanged: true)
            return (notice, s.subscribers.values.compactMap(\.subscription).filter(\.interest.attachments))
        }
        for subscriber in subscribers { subscriber.enqueue(notice) }
    }

    /// Tells subscribers that the conflict log changed outside a state change (an entry was
    /// marked resolved).
    public func publishConflictsChanged() {
        let (notice, subscribers) = state.withLock { s in
            s.sequence += 1
            let notice = CommitNotice(sequence: s.sequence, keys: [], reload: false, localSettingsChanged: false,
                                      conflictsChanged: true, origins: [:], reloadOrigin: nil, outgoing: [], resync: false)
            return (notice, s.subscribers.values.compactMap(\.subscription))
        }
        for subscriber in subscribers { subscriber.enqueue(notice) }
    }
}

private struct WeakSubscription {
    weak var subscription: CommitSubscription?
}

/// One subscriber's queue of commit notices: ``waitForChanges()``, then ``drain()``;
/// ``cancel()`` or dropping the last reference ends it (the feed holds it weakly).
package final class CommitSubscription: Sendable {
    private struct State {
        var queue: [CommitNotice] = []
        /// Notices already filtered into one set (when the queue grew long, or requeued).
        var merged = PendingChanges()
        var waiter: CheckedContinuation<Void, Never>?
        var cancelled = false
        /// ``poke()`` ran since the last wait returned.
        var poked = false
    }
    /// Queued notices beyond this are filtered into one set at once, so a consumer that lags
    /// behind a stream of commits holds O(changed keys) memory, not O(commits).
    private static let queueLimit = 64

    let id: Int
    /// What this subscription is told about.
    public let interest: CommitInterest
    private let state = Mutex(State())
    private let feed: Mutex<WeakFeed>

    /// The feed, weakly: a subscription must not keep a store's feed alive.
    private struct WeakFeed {
        weak var feed: CommitFeed?
    }

    init(id: Int, interest: CommitInterest, feed: CommitFeed) {
        self.id = id
        self.interest = interest
        self.feed = Mutex(WeakFeed(feed: feed))
    }

    deinit { feed.withLock { $0.feed }?.remove(id) }

    func enqueue(_ notice: CommitNotice) {
        if isIrrelevant(notice) { return }
        let waiter = state.withLock { s -> CheckedContinuation<Void, Never>? in
            guard !s.cancelled else { return nil }
            s.queue.append(notice)
            if s.queue.count > Self.queueLimit {
                for queued in s.queue { s.merged.absorb(queued, interest) }
                s.queue = []
            }
            defer { s.waiter = nil }
            return s.waiter
        }
        waiter?.resume()
    }

    /// Whether a small notice certainly holds nothing of interest (checked at once, so an
    /// observer of one collection is not woken by commits to others). Large notices are
    /// filtered later, on the subscriber's own task.
    private func isIrrelevant(_ notice: CommitNotice) -> Bool {
        guard let collections = interest.collections, !notice.reload, notice.keys.count <= 32,
              !(interest.outgoing && (!notice.outgoing.isEmpty || notice.resync)),
              !(interest.attachments && notice.attachmentsChanged),
              !(interest.localSettings && notice.localSettingsChanged),
              !(interest.conflicts && notice.conflictsChanged) else { return false }
        return !notice.keys.contains { collections.contains($0.collection) }
    }

    /// Takes everything accumulated so far (possibly nothing).
    public func drain() -> PendingChanges {
        state.withLock { s in
            var pending = s.merged
            for notice in s.queue { pending.absorb(notice, interest) }
            s.queue = []
            s.merged = PendingChanges()
            return pending
        }
    }

    /// Puts drained changes back, to be drained again (they were looked at against a snapshot
    /// that may not include all of them).
    public func requeue(_ changes: PendingChanges) {
        state.withLock { s in s.merged.absorb(changes) }
    }

    /// Waits until some notice is queued (returns at once if one is). Returns false once the
    /// subscription is cancelled, or when the calling task is cancelled. Drain with ``drain()``
    /// afterwards — after taking a snapshot, so the snapshot holds at least what is drained.
    public func waitForChanges() async -> Bool {
        while true {
            if Task.isCancelled { return false }
            let (cancelled, ready) = state.withLock { s in
                defer { s.poked = false }
                return (s.cancelled, !s.queue.isEmpty || !s.merged.isEmpty || s.poked)
            }
            if cancelled { return false }
            if ready { return true }
            await withTaskCancellationHandler {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let resumeNow = state.withLock { s -> Bool in
                        if s.cancelled || !s.queue.isEmpty || !s.merged.isEmpty || s.poked || Task.isCancelled { return true }
                        s.waiter = continuation
                        return false
                    }
                    if resumeNow { continuation.resume() }
                }
            } onCancel: {
                self.wake()
            }
        }
    }

    /// Makes ``waitForChanges()`` return (now, or at its next call) even if nothing is queued:
    /// a live query whose window of time moved.
    public func poke() {
        state.withLock { $0.poked = true }
        wake()
    }

    private func wake() {
        let waiter = state.withLock { s -> CheckedContinuation<Void, Never>? in
            defer { s.waiter = nil }
            return s.waiter
        }
        waiter?.resume()
    }

    /// Ends the subscription: ``waitForChanges()`` returns false, and nothing more is queued.
    public func cancel() {
        state.withLock { s in
            s.cancelled = true
            s.queue = []
        }
        wake()
        feed.withLock { $0.feed }?.remove(id)
    }
}

extension ReplicaStore {
    /// A snapshot of the state together with the sequence number of the newest change it
    /// includes: every change with a higher number came after it. Subscribe first, then take
    /// the snapshot; changes drained later whose ``PendingChanges/newestSequence`` is above
    /// `sequence` are not all in it.
    public func consistentSnapshot() -> (state: ReplicaState, sequence: UInt64) {
        // A seqlock read: the store publishes a change's notice under the same lock that
        // guards its state, so if the sequence is the same before and after reading the state,
        // the state is exactly the one after change `sequence`.
        var before = commits.sequence
        for _ in 0..<10_000 {
            let snapshot = state
            let after = commits.sequence
            if after == before { return (snapshot, before) }
            before = after
        }
        return (state, before)  // unreachable in practice; `before` understates, which is safe
    }
}
