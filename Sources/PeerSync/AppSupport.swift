@_spi(Engine) import PeerSyncCRDT
import PeerSyncStore
import Synchronization

/// The app-facing API's per-replica state (``Replica/appSupport``): who watches the store for
/// other processes' commits on behalf of live observations, the names of replicas met, and
/// the attachment collector once attachments are used.
final class AppSupport: Sendable {
    private struct State {
        var watchers = 0
        var watchTask: Task<Void, Never>?
        var names: [ReplicaID: String] = [:]
        var nameLearner: Task<Void, Never>?
        var attachments: AttachmentCollector?
        var observationRounds = 0
    }
    private let state = Mutex(State())
    /// The record versions handed to the app (stale copies are refused on save).
    let reads = ReadLedger()

    // MARK: - Watching other processes

    /// Keeps the replica polling its store for other processes' commits until the returned
    /// lease is released (reference counted over all live observations). Uses
    /// ``Replica/watchOtherProcesses()``, so commits it finds are also shipped to peers.
    func watchOtherProcesses(_ replica: Replica) -> WatchLease {
        state.withLock { s in
            s.watchers += 1
            if s.watchers == 1 { s.watchTask = Task { await replica.watchOtherProcesses() } }
        }
        return WatchLease(self)
    }

    fileprivate func release() {
        let task = state.withLock { s -> Task<Void, Never>? in
            s.watchers -= 1
            guard s.watchers == 0 else { return nil }
            defer { s.watchTask = nil }
            return s.watchTask
        }
        task?.cancel()
    }

    /// Whether a watch task runs (for tests).
    var isWatchingOtherProcesses: Bool { state.withLock { $0.watchTask != nil } }

    /// How many times observations looked at changes (whether or not they emitted), for tests
    /// that must know a change was looked at and found irrelevant.
    var observationRounds: Int { state.withLock { $0.observationRounds } }

    func countObservationRound() {
        state.withLock { $0.observationRounds += 1 }
    }

    // MARK: - Names

    func setName(_ name: String?, for replica: ReplicaID) {
        state.withLock { $0.names[replica] = name }
    }

    func name(of replica: ReplicaID) -> String? {
        state.withLock { $0.names[replica] }
    }

    /// Learns the names of peers from the change stream (once per replica).
    func learnNames(from replica: Replica) {
        state.withLock { s in
            guard s.nameLearner == nil else { return }
            let changes = replica.changes()
            s.nameLearner = Task { [weak self] in
                for await change in changes {
                    guard case .peer(let name, let id) = change.origin else { continue }
                    guard let self else { return }
                    self.setName(name, for: id)
                }
            }
        }
    }

    // MARK: - Attachments

    func attachments(_ replica: Replica) -> AttachmentCollector {
        let (collector, isNew) = state.withLock { s -> (AttachmentCollector, Bool) in
            if let existing = s.attachments { return (existing, false) }
            let collector = AttachmentCollector(store: replica.store, logger: replica.logger)
            s.attachments = collector
            return (collector, true)
        }
        if isNew { collector.start() }
        return collector
    }

    /// Ends the background work (the replica is closing): watching other processes, learning
    /// names, the attachment collector.
    func stop() {
        let (watch, learner, attachments) = state.withLock { s in
            defer {
                s.watchTask = nil
                s.nameLearner = nil
                s.attachments = nil
            }
            return (s.watchTask, s.nameLearner, s.attachments)
        }
        watch?.cancel()
        learner?.cancel()
        attachments?.stop()
    }

    deinit {
        state.withLock { s in
            s.watchTask?.cancel()
            s.nameLearner?.cancel()
            s.attachments?.stop()
        }
    }
}

/// Keeps the store watched while it lives.
final class WatchLease: Sendable {
    private let support: AppSupport

    fileprivate init(_ support: AppSupport) {
        self.support = support
    }

    deinit { support.release() }
}
