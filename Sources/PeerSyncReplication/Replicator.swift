import Dispatch
import Logging
import Crypto
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncWire
import Synchronization

/// Carries out the replication decisions of one node (``ReplicationCore``) for every session,
/// whatever its transport: TCP+TLS sessions of ``SyncNode`` and an app's own transports
/// (``SyncSession``). It owns the node's one timer, commits what peers send on a dedicated
/// queue (never on the cooperative pool), and wakes session writers when they have output.
package actor Replicator {
    public nonisolated let replicaID: ReplicaID
    /// This node's device key (sessions sign with it; TLS certificates are made from it).
    public nonisolated let deviceKey: DeviceKey
    /// An upgraded group's old secret, if any (see ``LocalIdentity/legacySecret``).
    public nonisolated let legacySecret: GroupSecret?
    public nonisolated let configuration: SyncConfiguration
    nonisolated let storage: any SyncStorage
    nonisolated let logger: Logger
    var core: ReplicationCore
    /// This node's device and group (a pending join clears once the roster admits it).
    public internal(set) var identity: LocalIdentity
    private var transports: [SessionID: Transport] = [:]
    private var timer: Task<Void, Never>?
    private var emptyWaiters: [CheckedContinuation<Void, Never>] = []
    /// Waiting in ``shutdown()`` for the commit in flight (and any it starts) to finish.
    var idleCommitWaiters: [CheckedContinuation<Void, Never>] = []
    private var closedTraffic = TrafficCounters()
    /// Ineffective roster entries already logged.
    var reportedIneffective: Set<RosterEntryID> = []
    /// Devices whose catch-up round this node stored since it started (``confirmAdmissions()``).
    var roundsHeardFrom: Set<DeviceID> = []
    var confirming = false
    let commitQueue = DispatchQueue(label: "peersync.commit")
    /// Attachment file work, in order (Replicator+Attachments.swift).
    let attachmentQueue = DispatchQueue(label: "peersync.attachments")
    private nonisolated let subscribers = Broadcaster<NodeEvent>(buffer: 10_000)
    /// The storage's commits to ship: the one way local changes reach peers.
    private nonisolated let outgoing: any CommitFollower
    /// The task that hands ``outgoing``'s commits to ``ship(_:)`` (started by `init`).
    private nonisolated let pump = Mutex<Task<Void, Never>?>(nil)

    private struct Transport {
        let signal: OutputSignal
        let close: @Sendable () -> Void
        let counters: (@Sendable () -> (read: Int, written: Int))?
        /// Called once the session is established (the dialer frees the attempt's slot).
        var established: (@Sendable () -> Void)?
    }

    /// A replicator for the replica behind `storage`. From now on it ships every commit to the
    /// storage that did not come from a peer (``SyncStorage/followCommits()``); sessions open
    /// with ``openSession(_:close:counters:established:)``.
    package init(storage: any SyncStorage, replicaID: ReplicaID, name: String, identity: LocalIdentity,
                configuration: SyncConfiguration, logger: Logger) {
        self.storage = storage
        self.replicaID = replicaID
        self.configuration = configuration
        self.identity = identity
        deviceKey = identity.key
        legacySecret = identity.legacySecret
        var logger = logger
        logger[metadataKey: "replica"] = "\(replicaID.shortDescription)"
        self.logger = logger
        core = ReplicationCore(settings: .init(localReplica: replicaID, name: configuration.name ?? name,
                                               timing: configuration.timing, limits: configuration.limits,
                                               transfer: configuration.transfer, identity: identity,
                                               attachments: configuration.attachments && storage.storesAttachments,
                                               signedReports: storage.seenReports() != nil,
                                               deflateChunks: configuration.deflateChunks),
                               roster: storage.snapshot().roster(of: identity.groupID), reports: storage.seenReports() ?? [])
        outgoing = storage.followCommits()
        let follower = outgoing
        // The actor drains the feed itself (``shipPending()``): a delta taken here and shipped
        // after an actor hop could miss a goodbye sent in between (found under load: the last
        // save before `stop` never reached the peer).
        let task = Task { [weak self] in
            while await follower.waitForCommits() {
                guard let self else { return }
                await self.shipPending()
            }
        }
        pump.withLock { $0 = task }
    }

    deinit {
        outgoing.cancel()
        pump.withLock { $0?.cancel() }
    }

    /// The roster as the local state has it now.
    public var roster: Roster { core.roster }

    // MARK: - Events

    /// What the node does. Each call makes a new subscriber; one that falls 10,000 events
    /// behind loses the oldest.
    public nonisolated func events() -> AsyncStream<NodeEvent> { subscribers.subscribe() }

    /// The events a replica acts on (a join, a removal, a restore detected), losing none: a
    /// subscriber that must not miss one. Its reader must keep up on average (events come per
    /// session and per commit, never per record).
    package nonisolated func controlEvents() -> AsyncStream<NodeEvent> { subscribers.subscribe(lossless: true) }

    package nonisolated func emit(_ event: NodeEvent) { subscribers.yield(event) }

    private nonisolated func finishEvents() { subscribers.finish() }

    // MARK: - Sessions

    /// Opens a session on a connected transport. `close` cuts the transport; `counters` reads its
    /// byte counters (TLS included) if it has them; `established` is called once if the session
    /// is established. Returns the session and the signal its writer waits on.
    package func openSession(
        _ origin: SessionOrigin, close: @escaping @Sendable () -> Void,
        counters: (@Sendable () -> (read: Int, written: Int))? = nil, established: (@Sendable () -> Void)? = nil
    ) -> (SessionID, OutputSignal) {
        startTimer()
        let signal = OutputSignal()
        let nonce = (0..<16).map { _ in UInt8.random(in: 0...255) }
        let (id, actions) = core.open(origin, now: .now, wallClock: configuration.wallClock(), state: storage.snapshot(), nonce: nonce)
        transports[id] = Transport(signal: signal, close: close, counters: counters, established: established)
        perform(actions)
        return (id, signal)
    }

    /// Frames from the peer of session `id` that arrived together, in order: each is carried
    /// out as it comes, and a commit starts after the last (what they queued shares it).
    package func receive(_ id: SessionID, frames: [(type: UInt8, body: [UInt8])]) {
        guard !frames.isEmpty else { return }
        for frame in frames {
            perform(core.receive(id, type: frame.type, body: frame.body, now: .now, wallClock: configuration.wallClock(),
                                 state: storage.snapshot(), startingCommit: false))
        }
        perform(core.startCommitIfIdle(state: storage.snapshot(), now: .now))
    }

    /// The session's inbound bytes broke framing (over the limit, bad length).
    package func frameError(_ id: SessionID, _ error: WireError) {
        perform(core.frameError(id, error, now: .now))
    }

    /// Closes a session from this side with a goodbye after what is queued.
    func closeSession(_ id: SessionID) {
        perform(core.closeLocally(id, now: .now))
    }

    /// The transport of session `id` is gone. Returns why the session ended (the core's reason
    /// if it closed it, else `reason`) and whether it was established; nil if it had ended before.
    @discardableResult
    package func transportEnded(_ id: SessionID, reason: SessionEndReason) -> (reason: SessionEndReason, established: Bool)? {
        guard let transport = transports.removeValue(forKey: id) else { return nil }
        let ending = (reason: core.session(id)?.endReason ?? reason, established: core.session(id)?.announced ?? false)
        if let session = core.session(id) {
            let read = transport.counters?().read ?? session.bytesReceived
            let written = transport.counters?().written ?? session.bytesSent
            closedTraffic.bytesReceived += read
            closedTraffic.bytesSent += written
            closedTraffic.framesSent += session.framesSent
            closedTraffic.framesReceived += session.framesReceived
            closedTraffic.frameBytesSentByType.merge(session.frameBytesSentByType, uniquingKeysWith: +)
        }
        transport.signal.finish()
        perform(core.transportEnded(id, reason: reason))
        if transports.isEmpty {
            for waiter in emptyWaiters { waiter.resume() }
            emptyWaiters = []
        }
        return ending
    }

    /// The next bytes to write for session `id`, up to about `budget` (nil: nothing now).
    package func nextBatch(_ id: SessionID, budget: Int = 64 << 10) -> OutboundBatch? {
        let storage = self.storage
        let (batch, actions) = core.nextBatch(id, budget: budget, now: .now, state: storage.snapshot(),
                                              gossip: { storage.seenReports() })
        perform(actions)
        return batch
    }

    /// The replica at the other end of session `id`, once its hello arrived.
    package func peerReplica(of id: SessionID) -> ReplicaID? { core.session(id)?.peer?.replicaID }

    /// The device at the other end of session `id`, once its hello's key was checked.
    package func peerDevice(of id: SessionID) -> DeviceID? { core.session(id)?.peerKey?.deviceID }

    // MARK: - Local changes

    /// Ships committed local changes to every connected peer: only ever what the storage's
    /// commit feed yields (the one way in).
    private func ship(_ commits: OutgoingCommits) {
        if commits.resync { resyncAll() }
        guard let delta = commits.delta else { return }
        perform(core.broadcast(delta, state: storage.snapshot(), now: .now))
        if delta.touchesRoster { refreshRoster() }
    }

    /// Ships what is committed and not yet shipped, now (before a goodbye).
    private func shipPending() {
        if let commits = outgoing.takePending() { ship(commits) }
    }

    /// A compaction step purged deleted records: every peer gets a digest (and the gossip it
    /// lacks) with the next digest round (PROTOCOL §19.4).
    public func compacted() {
        perform(core.compacted(now: .now))
    }

    /// Sends every peer what it lacks (after the local state was reloaded from disk).
    func resyncAll() {
        perform(core.resyncAll() + core.attachmentsRescan(state: storage.snapshot()))
    }

    // MARK: - Status

    /// The peers with an established session.
    public func peers() -> [PeerStatus] {
        core.peerStatuses().map { status in
            PeerStatus(info: status.0, lastConvergedAt: status.lastConvergedAt.map { Date(timeIntervalSince1970: Double($0) / 1000) },
                       bytesSent: status.bytesSent, bytesReceived: status.bytesReceived)
        }
    }

    /// Totals over every session this node has had.
    public func traffic() -> TrafficCounters {
        var total = closedTraffic
        for (id, transport) in transports {
            guard let session = core.session(id) else { continue }
            total.bytesReceived += transport.counters?().read ?? session.bytesReceived
            total.bytesSent += transport.counters?().written ?? session.bytesSent
            total.framesSent += session.framesSent
            total.framesReceived += session.framesReceived
            total.frameBytesSentByType.merge(session.frameBytesSentByType, uniquingKeysWith: +)
        }
        total.attachmentBytesSent = core.attachmentState.bytesSent
        total.attachmentBytesReceived = core.attachmentState.bytesReceived
        return total
    }

    // MARK: - Lifecycle

    /// Says goodbye to every peer, waits (bounded) until each goodbye is written and every
    /// transport is closed, then stops the timer.
    public func shutdown() async {
        shipPending()  // a save made just before sync stops still reaches the peers
        outgoing.cancel()
        pump.withLock { $0?.cancel() }
        perform(core.shutdown(now: .now))
        await waitUntilNoSessions(timeout: configuration.timing.closeDrainTimeout + .seconds(1))
        for transport in transports.values { transport.close() }
        await waitUntilNoSessions(timeout: .seconds(2))
        timer?.cancel()
        timer = nil
        // What was received and is being stored finishes before stop returns: an app may close
        // or delete the store next (a commit still writing then failed with "written but not
        // flushed", or wrote into a store being closed). Bounded like the drains above.
        await waitForCommits(timeout: .seconds(30))
        await drainCommitQueue()
        await drainAttachmentQueue()
        finishEvents()
    }

    private func waitUntilNoSessions(timeout: Duration) async {
        guard !transports.isEmpty else { return }
        let deadline = Task { [weak self] in
            try? await Task.sleep(for: timeout)
            await self?.releaseEmptyWaiters()
        }
        await withCheckedContinuation { emptyWaiters.append($0) }
        deadline.cancel()
    }

    private func releaseEmptyWaiters() {
        for waiter in emptyWaiters { waiter.resume() }
        emptyWaiters = []
    }

    private func startTimer() {
        guard timer == nil else { return }
        let period = configuration.timing.tick
        timer = Task { [weak self] in
            while !Task.isCancelled {
                try? await Task.sleep(for: period)
                guard let self else { return }
                await self.tick()
            }
        }
    }

    private func tick() {
        perform(core.tick(now: .now))
        perform(core.refreshOwnReport(state: storage.snapshot(), wallClock: configuration.wallClock()))
    }

    // MARK: - Carrying out

    func perform(_ actions: [ReplicationCore.Action]) {
        for action in actions {
            switch action {
            case .wake(let id):
                transports[id]?.signal.signal()
            case .wakeAt(let id, let instant):
                let signal = transports[id]?.signal
                Task {
                    try? await Task.sleep(until: instant, clock: .continuous)
                    signal?.signal()
                }
            case .closeTransport(let id):
                transports[id]?.close()
            case .commit(let request):
                commit(request)
            case .commitAt(let instant):
                Task { [weak self] in
                    try? await Task.sleep(until: instant, clock: .continuous)
                    await self?.commitDue()
                }
            case .event(let event):
                if case .peerConnected(let info) = event, let id = core.established[info.replicaID] {
                    transports[id]?.established?()
                    transports[id]?.established = nil
                }
                emit(event)
            case .admitDevice(let id, let device, let entries):
                admit(id, device, entries)
            case .attachmentIO(let io):
                performAttachmentIO(io)
            case .recordSeen(let reports):
                recordSeen(reports)
            case .saveOwnReport(let report):
                saveOwnReport(report)
            case .log(let line):
                let level: Logger.Level = switch line.level {
                case .debug: .debug
                case .info: .info
                case .warning: .warning
                case .error: .error
                }
                logger.log(level: level, "\(line.message)", metadata: line.metadata.mapValues { .string($0) })
            }
        }
    }

    private func commit(_ request: ReplicationCore.CommitRequest) {
        let storage = self.storage
        let rounds = Set(request.parts.filter(\.endsRound).compactMap { core.session($0.session)?.peerKey?.deviceID })
        let names = Set(request.parts.map(\.origin))
        let journal = names.count == 1 ? names.first! : "peers"
        let deltas = request.deltas
        // Who sent each delta, for the app's change stream (and so the feed does not ship it back).
        let origins = request.parts.flatMap { part -> [ChangeOrigin] in
            let peer = core.session(part.session)?.peer
            let origin = ChangeOrigin.peer(name: peer?.name ?? part.origin, replicaID: peer?.replicaID ?? ReplicaID(high: 0, low: 0))
            return Array(repeating: origin, count: part.deltas.count)
        }
        let completing = request.completing
        commitQueue.async { [weak self] in
            let result: Result<(outcomes: [MergeOutcome], dropped: [RecordKey]), any Error> = Result {
                try storage.applyRemote(deltas, origins: origins, journal: journal, completing: completing)
            }
            Task { await self?.commitFinished(request.id, result, rounds: rounds) }
        }
    }

    private func commitDue() {
        perform(core.commitDue(now: .now, state: storage.snapshot()))
    }

    private func commitFinished(_ id: UInt64, _ result: Result<(outcomes: [MergeOutcome], dropped: [RecordKey]), any Error>,
                                rounds: Set<DeviceID>) {
        switch result {
        case .success(let (outcomes, dropped)):
            let touchedRoster = outcomes.contains { $0.changedRecords.contains { $0.collection == RosterEntry.collection } }
            perform(core.committed(id, outcomes: outcomes, state: storage.snapshot(), now: .now))
            if !dropped.isEmpty {
                // Records the group deleted and purged while this replica was in the past.
                logger.info("dropped records the group deleted and purged while this store was away",
                            metadata: ["records": "\(dropped.count)"])
            }
            let heardNew = !rounds.isSubset(of: roundsHeardFrom)
            roundsHeardFrom.formUnion(rounds)
            if touchedRoster { refreshRoster() } else if heardNew { confirmAdmissions() }
        case .failure(let error as SyncStorageRefusal):
            perform(core.commitFailed(id, error: error.detail, refused: true, now: .now, state: storage.snapshot()))
        case .failure(let error):
            perform(core.commitFailed(id, error: "\(error)", refused: false, now: .now, state: storage.snapshot()))
        }
        if core.inFlight == nil { releaseCommitWaiters() }
    }
}
