@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncWire

/// Every replication decision of a node, with no sockets, clocks or storage: which session gets
/// which delta, catch-up rounds, the duplicate-connection rule, forwarding, acks and digests,
/// keepalive and dead peers, what to commit and when. Events go in (a session opened, a frame,
/// a commit finished, a local change, a timer tick carrying a monotonic instant and the wall
/// clock); ``Action``s come out. ``Replicator`` carries them out; tests drive it directly with
/// in-memory states.
///
/// Commits are serialized: while one is in flight, applies from every session queue up and go
/// together in the next one (group commit).
struct ReplicationCore {
    struct Settings {
        var localReplica: ReplicaID
        var name: String
        var timing: SyncTiming
        var limits: SyncLimits
        var transfer: TransferMode
        var identity: LocalIdentity
        /// Serve and fetch attachment bytes (announced in the hello).
        var attachments = false
        /// Sign, send and read the compaction gossip (`seen`, type 16, signed reports), and send
        /// complete rounds to peers behind the stable context (announced in the hello).
        var signedReports = false
        /// Send deflated catch-up chunks to peers that read them, and announce reading them.
        var deflateChunks = true
    }

    enum Action {
        /// The session has bytes to send: its writer should call ``nextBatch``.
        case wake(SessionID)
        /// Wake the session's writer at this instant (live deltas held back to share a frame).
        case wakeAt(SessionID, MonotonicInstant)
        /// Close the session's transport now (without writing more).
        case closeTransport(SessionID)
        /// Persist these deltas in one transaction, then report ``committed`` or ``commitFailed``.
        case commit(CommitRequest)
        /// Call ``commitDue(now:state:)`` at this instant (whole rounds held for one in progress).
        case commitAt(MonotonicInstant)
        case event(NodeEvent)
        case log(CoreLog)
        /// Store the entries that admit an unknown device as one local change, then report ``joinerAdmitted``.
        case admitDevice(SessionID, device: DeviceID, entries: [RosterEntry])
        /// File work for attachments, on the shell's attachment queue (ReplicationCore+Attachments.swift).
        case attachmentIO(AttachmentIO)
        /// Record these checked reports in storage (ReplicationCore+Gossip.swift); if that grew
        /// what this node knows, report ``gossipChanged(now:)``.
        case recordSeen([SeenReport])
        /// Store this node's newly signed report, then report ``ownReportSaved(_:now:)``.
        case saveOwnReport(SeenReport)
    }

    var settings: Settings
    /// The group's roster as the local state has it (``updateRoster``).
    var roster: Roster
    var sessions: [SessionID: PeerSession] = [:]
    var established: [ReplicaID: SessionID] = [:]
    var nextSessionID: UInt64 = 1
    var queued: [ApplyPart] = []
    var inFlight: CommitRequest?
    /// Context before the in-flight commit: a delta that adds to it is forwarded.
    var contextBeforeCommit = CausalContext()
    var nextCommitID: UInt64 = 1
    /// Since when queued rounds wait for one still arriving (``SyncTiming/roundCommitHold``).
    var commitHeldSince: MonotonicInstant?
    var shuttingDown = false
    /// Full-state repairs the convergence watchdog made.
    var repairs = 0
    /// After a refused group commit: parts still to commit one at a time (to find the culprit).
    var soloCommits = 0
    /// When ``tick(now:)`` last ran.
    var lastTick: MonotonicInstant?
    /// When data last moved: a delta or chunk received or sent, a commit, a local change. Digest
    /// rounds wait until the whole node has been quiet for ``SyncTiming/digestQuietPeriod``.
    var lastActivity: MonotonicInstant?
    /// When the last digest round was due (rounds come at least every 10 quiet periods while busy).
    var lastRound: MonotonicInstant?
    /// When the last digest round that could carry the compaction gossip was (quiet rounds
    /// always can; while busy, one in ``busyGossipRounds``).
    var lastGossipRound: MonotonicInstant?
    /// Log lines decided where returning actions is awkward; drained with the next actions.
    var queuedLogs: [CoreLog] = []
    /// Attachment transfers (ReplicationCore+Attachments.swift).
    var attachmentState: AttachmentCoreState
    /// The last report this node signed and stored; whether one is being stored; the gossip
    /// round it was signed in (ReplicationCore+Gossip.swift).
    var ownReport: SeenReport?
    var ownReportPending = false
    var ownReportRound: MonotonicInstant?
    /// The newest report time known for each other replica (for ``lostSince(of:holding:state:)``).
    var reportTimes: [ReplicaID: UInt64] = [:]
    /// Reports whose device or replica claim the roster did not have when they arrived (the
    /// newest per replica, within ``HeldReports/limit``): judged again whenever the roster
    /// changes, since the sender does not offer them again (ReplicationCore+Gossip.swift).
    var heldReports = HeldReports()
    /// Replica IDs claimed by roster entries in frames admitted but not yet committed, with the
    /// session that brought them: a catch-up's roster chunk and the chunks with the new device's
    /// writes may be committed separately, and another session may forward those writes first.
    var provisionalClaims: [ReplicaID: SessionID] = [:]
    var proof = MemberProof()  // this device's proof of admission (ReplicationCore+Proof.swift)
    /// Refusals already logged, by peer and reason (ReplicationCore+Refusals.swift).
    var loggedRefusals: Set<String> = []

    /// `reports`: the reports storage holds (this node's own last one among them).
    init(settings: Settings, roster: Roster, reports: [SeenReport] = []) {
        self.settings = settings
        self.roster = roster
        attachmentState = AttachmentCoreState(limits: settings.limits)
        for report in reports {
            if report.replica == settings.localReplica {
                ownReport = report
            } else {
                reportTimes[report.replica] = max(reportTimes[report.replica] ?? 0, report.time)
            }
        }
    }

    /// The optional features this node announces in its hello.
    var localFeatures: HelloFeatures {
        var features: HelloFeatures = []
        if settings.attachments { features.insert(.attachments) }
        if settings.signedReports { features.insert(.signedReports) }
        if settings.deflateChunks { features.insert(.deflatedChunks) }
        features.insert(.eventCounters)
        return features
    }

    var skewMilliseconds: UInt64 { UInt64(max(0, settings.timing.maxClockSkew.wholeMilliseconds)) }

    // MARK: - Inbound frames

    /// One frame from a session's peer, received when the wall clock read `wallClock`.
    /// `startingCommit` false: what it queued waits for ``startCommitIfIdle(state:now:)`` after
    /// the last frame of the same read, so deltas that shared a TLS record share a commit.
    mutating func receive(
        _ id: SessionID, type: UInt8, body: [UInt8], now: MonotonicInstant, wallClock: UInt64, state: some ReplicaView,
        startingCommit: Bool = true
    ) -> [Action] {
        let actions = handle(id, type: type, body: body, now: now, wallClock: wallClock, state: state)
        return startingCommit ? actions + startCommitIfIdle(state: state, now: now) : actions
    }

    private mutating func handle(
        _ id: SessionID, type: UInt8, body: [UInt8], now: MonotonicInstant, wallClock: UInt64, state: some ReplicaView
    ) -> [Action] {
        // In place, never through a local copy of the session: a copy alive while a chunk is
        // appended to its batch would make every append copy the whole batch (a 100k-record
        // round took minutes).
        guard let phase = sessions[id]?.phase, phase != .closing else { return [] }
        sessions[id]?.lastReceived = now
        sessions[id]?.framesReceived += 1
        sessions[id]?.bytesReceived += body.count + 1 + Varint.size(of: UInt64(body.count + 1))
        // The one dispatch: the frame is decoded and checked against the phase's rules there.
        let decisions = sessions[id]?.machine.receive(type: type, body: body, now: wallClock, in: phase) ?? []
        var actions: [Action] = []
        for decision in decisions {
            actions += carryOut(decision, session: id, now: now, wallClock: wallClock, state: state)
            if sessions[id].map({ $0.phase == .closing }) ?? true { break }
        }
        actions += queuedLogs.map { .log($0) }
        queuedLogs = []
        return actions
    }

    /// Carries out what a frame means; the machine checked it against the session's phase.
    mutating func carryOut(
        _ decision: SessionStateMachine.Action, session id: SessionID, now: MonotonicInstant, wallClock: UInt64,
        state: some ReplicaView
    ) -> [Action] {
        switch decision {
        case .send(.pong(let nonce)):
            sessions[id]?.out.pong = nonce
            return [.wake(id)]
        case .send:
            return []
        case .helloAccepted(let hello):
            // The peer holds events this replica lacks: once admitted, it sends them in a round.
            sessions[id]?.firstRoundPending = !state.context.includes(hello.context)
            return authenticate(id, hello: hello, now: now, state: state)
        case .auth(let signature, let lostSince):
            return admit(id, signature: signature, lostSince: lostSince, now: now, state: state)
        case .join(let entries):
            return join(id, entries: entries, now: now, wallClock: wallClock, state: state)
        case .applyChunk(let delta, let index, let count, let records, let stable):
            return applyChunk(id, delta, index: index, count: count, records: records, stable: stable, now: now, state: state)
        case .applyDelta(var delta):
            lastActivity = now
            if let refusal = ownNameRefusal(delta, state: state) { return refuse(id, .malformed, refusal, now: now) }
            switch admitData(delta, from: id, now: now, state: state) {
            case .refused(let actions): return actions
            case .admitted(let admitted): delta = admitted
            }
            guard let session = sessions[id] else { return [] }
            queued.append(ApplyPart(session: id, deltas: [delta], endsRound: false, origin: origin(of: session)))
            return []
        case .acked(let context, let neighbors, let incremental):
            let hello = sessions[id]?.peer
            sessions[id]?.withLink { link in
                link.delivered.merge(context)
                if incremental {
                    var known = link.lastAckContext ?? hello?.context ?? CausalContext()
                    known.merge(context)
                    link.lastAckContext = known
                } else {
                    link.lastAckContext = context
                }
                if let neighbors { link.neighbors = Set(neighbors) }
            }
            // An ack is not a compaction report: only a signed report counts (PROTOCOL §19).
            return []
        case .digest(let digest, _):
            guard let info = sessions[id]?.info else { return [] }
            if digest == state.digest {
                sessions[id]?.lastConvergedAt = wallClock
                sessions[id]?.withLink { $0.divergencePersists = false }
                return [.event(.converged(info, digest: digest))]
            }
            // Another round after the next quiet period, with our context this time: then the
            // peer can tell a transient difference from a divergence.
            let acked = sessions[id]?.withLink { link in
                link.changedSinceDigest = true
                link.ackOwed = true
                return link.lastAckContext
            }
            guard let acked, acked == state.context else { return [] }
            // Equal events, different digests: a divergence. (Compaction cannot cause one: the
            // digest leaves deleted records out, so whether one is purged yet does not show.)
            return watchdog(id, info: info, now: now, state: state)
        case .breakdown(_, let theirs):
            guard let info = sessions[id]?.info else { return [] }
            let (collections, writers) = state.records.digestBreakdown().differences(from: theirs)
            sessions[id]?.withLink { $0.divergence = (collections, writers) }
            return [.log(CoreLog(.warning, "divergence with a peer", [
                        "peer.id": info.replicaID.shortDescription, "differs.collections": collections.joined(separator: ","),
                        "differs.writers": writers.map(\.shortDescription).joined(separator: ","),
                    ])),
                    .event(.divergenceDetail(info, collections: collections, writers: writers))]
        case .attachmentRequest(let request):
            return attachmentRequested(id, request)
        case .attachmentData(let data):
            return attachmentDataReceived(id, data)
        case .attachmentUnavailable(let hash):
            return attachmentUnavailable(id, hash: hash)
        case .seen(let reports):
            return receiveSeen(id, reports: reports, now: now)
        case .close(let reason, let text, let notifyPeer):
            if notifyPeer { return refuse(id, reason, text, now: now) } else if reason == .notAdmitted { peerRefusedUs(id) }
            guard var session = sessions[id] else { return [] }
            session.close(with: nil, reason: .peerClosed(reason, detail: text), now: now)
            sessions[id] = session
            return [.log(CoreLog(.debug, "peer closed the session", sessionMetadata(session, ["reason": "\(reason)", "detail": text]))),
                    .closeTransport(id)]
        }
    }

    /// A chunk of the peer's catch-up round: its records wait in the session's batch, committed
    /// together at the round's end or when the batch is large.
    private mutating func applyChunk(
        _ id: SessionID, _ delta: RecordMap, index: UInt64, count: UInt64, records: UInt64, stable: CausalContext?,
        now: MonotonicInstant, state: some ReplicaView
    ) -> [Action] {
        lastActivity = now
        if let refusal = ownNameRefusal(delta, state: state) { return refuse(id, .malformed, refusal, now: now) }
        // A complete round (PROTOCOL §6.5): note every record it carries, as the peer sent it.
        sessions[id]?.withLink { link in
            if index == 0 { link.completeRound = stable.map { CompleteRound(stable: $0, keys: []) } }
            guard link.completeRound != nil else { return }
            for (collection, records) in delta.collections {
                for record in records.keys { link.completeRound?.keys.insert(RecordKey(collection: collection, id: record)) }
            }
        }
        var delta = delta
        switch admitData(delta, from: id, now: now, state: state) {
        case .refused(let actions): return actions
        case .admitted(let admitted): delta = admitted
        }
        let last = index + 1 == count
        let limit = settings.limits.catchUpBatchBytes
        // In place: a copy of the session would copy the batch array per chunk (quadratic in
        // the chunks of a round).
        let full = sessions[id]?.withLink { link -> (batch: [RecordMap], bytes: Int, completing: CompleteRound?)? in
            link.batch.append(delta)
            link.batchBytes += delta.approximateWireBytes
            guard last || link.batchBytes >= limit else { return nil }
            defer {
                link.batch = []
                link.batchBytes = 0
                if last { link.completeRound = nil }
            }
            return (link.batch, link.batchBytes, last ? link.completeRound : nil)
        }
        guard let session = sessions[id] else { return [] }
        if last { sessions[id]?.firstRoundPending = false }
        if case let full?? = full {
            queued.append(ApplyPart(session: id, deltas: full.batch, roundBytes: full.bytes, endsRound: last, origin: origin(of: session),
                                    completing: full.completing))
        }
        guard let info = session.info else { return [] }
        return [.event(.catchUpProgress(info, chunk: clampedInt(index) + 1, chunks: clampedInt(count), records: clampedInt(records)))]
    }

    /// The convergence watchdog: both sides claim the same events but their states differ — a bug
    /// here or in the peer's implementation, or a store restored under the same replica ID that
    /// nothing revealed (docs/ARCHITECTURE.md, "Restores"). Each side sends its full state
    /// (joining heals any such split), and its digest breakdown so the other can log where they
    /// differed: once per session. If the digests still differ after that, a repair would not
    /// help — it would only loop — so the divergence is reported once (a warning naming the peer,
    /// the collections and writers that differ and the records this side did not take) and left
    /// for a person or the next version to settle.
    mutating func watchdog(_ id: SessionID, info: PeerInfo, now: MonotonicInstant, state: some ReplicaView) -> [Action] {
        guard let link = sessions[id]?.link else { return [] }
        guard link.lastRepairAt == nil else {
            guard !link.divergencePersists else { return [] }
            sessions[id]?.withLink { $0.divergencePersists = true }
            let (collections, writers) = link.divergence
            let records = link.echoesDropped.sorted()
            return [.log(CoreLog(.warning, "digests still differ after a full-state repair; not repairing again", [
                        "peer.id": info.replicaID.shortDescription, "peer.name": info.name,
                        "differs.collections": collections.joined(separator: ","),
                        "differs.writers": writers.map(\.shortDescription).joined(separator: ","),
                        "differs.records": records.map(\.description).joined(separator: ","),
                    ])),
                    .event(.divergencePersists(info, collections: collections, writers: writers, records: records))]
        }
        sessions[id]?.withLink { $0.lastRepairAt = now }
        sessions[id]?.out.push(catchUp: state.records)
        sessions[id]?.out.breakdownDue = true
        repairs += 1
        return [.log(CoreLog(.warning, "digests differ although both sides hold the same events; repairing by a full-state exchange",
                             ["peer.id": info.replicaID.shortDescription, "peer.name": info.name, "repairs": "\(repairs)",
                              "repair.cause": "equal contexts, different digests"])),
                .event(.divergenceRepaired(info, repairs: repairs)),
                .wake(id)]
    }

    /// A peer may echo writes in this replica's name, but never ones it did not make.
    func ownNameRefusal(_ delta: RecordMap, state: some ReplicaView) -> String? {
        let issued = state.context.maxCounter(of: settings.localReplica)
        guard let claimed = delta.highestCounter(of: settings.localReplica), claimed > issued else { return nil }
        return "the delta holds a write by this replica (counter \(claimed)) that it never made (its last is \(issued))"
    }
}

/// A log line decided by the core; the shell writes it with its logger.
struct CoreLog: Equatable {
    enum Level: Equatable { case debug, info, warning, error }
    let level: Level
    let message: String
    let metadata: [String: String]

    init(_ level: Level, _ message: String, _ metadata: [String: String] = [:]) {
        self.level = level
        self.message = message
        self.metadata = metadata
    }
}

/// `value` as an `Int`, clamped (peer-supplied counts are informational).
func clampedInt(_ value: UInt64) -> Int { value > UInt64(Int.max) ? Int.max : Int(value) }

extension RecordMap {
    /// The highest counter of `replica` anywhere in this map — its context, field dots, presence
    /// entries and removers — or nil if it appears nowhere.
    func highestCounter(of replica: ReplicaID) -> UInt64? {
        var highest: UInt64? = context.replicas.contains(replica) ? context.maxCounter(of: replica) : nil
        func note(_ counter: UInt64) { highest = max(highest ?? 0, counter) }
        for records in collections.values {
            for state in records.values {
                for register in state.fields.values where register.dot.replica == replica { note(register.dot.counter) }
                for (writer, entry) in state.presence {
                    if writer == replica { note(entry.counter) }
                    if let remover = entry.removedBy, remover.replica == replica { note(remover.counter) }
                }
            }
        }
        return highest
    }
}
