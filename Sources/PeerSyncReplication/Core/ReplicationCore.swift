import PeerSyncCRDT
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
        sessions[id]!.lastReceived = now
        sessions[id]!.framesReceived += 1
        sessions[id]!.bytesReceived += body.count + 1 + Varint.size(of: UInt64(body.count + 1))
        if readsAttachmentMessage(type) {
            return receiveAttachment(id, type: type, body: body, now: now)
        }
        if settings.signedReports, type == SeenMessage.kind {
            return receiveSeen(id, body: body, now: now)
        }
        let decisions = sessions[id]!.machine.receive(type: type, body: body, now: wallClock)
        var actions: [Action] = []
        for decision in decisions {
            actions += carryOut(decision, session: id, now: now, wallClock: wallClock, state: state)
            if sessions[id] == nil || sessions[id]!.phase == .closing { break }
        }
        actions += queuedLogs.map { .log($0) }
        queuedLogs = []
        return actions
    }

    mutating func carryOut(
        _ decision: SessionStateMachine.Action, session id: SessionID, now: MonotonicInstant, wallClock: UInt64,
        state: some ReplicaView
    ) -> [Action] {
        switch decision {
        case .send(.pong(let nonce)):
            sessions[id]!.out.pong = nonce
            return [.wake(id)]
        case .send:
            return []
        case .established(let hello):
            // The peer holds events this replica lacks: once admitted, it sends them in a round.
            sessions[id]!.firstRoundPending = !state.context.includes(hello.context)
            return authenticate(id, hello: hello, now: now, state: state)
        case .auth(let signature, let lostSince):
            sessions[id]!.peerLostSince = lostSince
            return admit(id, signature: signature, now: now, state: state)
        case .join(let entries):
            return join(id, entries: entries, now: now, wallClock: wallClock, state: state)
        case .applyChunk(var delta, let index, let count, let records, let stable):
            lastActivity = now
            guard sessions[id]!.phase == .established else { return refuse(id, .notAdmitted, "data before admission", now: now) }
            if let refusal = ownNameRefusal(delta, state: state) { return refuse(id, .malformed, refusal, now: now) }
            // A complete round (PROTOCOL §6.5): note every record it carries, as the peer sent it.
            if index == 0 { sessions[id]!.completeRound = stable.map { CompleteRound(stable: $0, keys: []) } }
            if sessions[id]!.completeRound != nil {
                for (collection, records) in delta.collections {
                    for id2 in records.keys { sessions[id]!.completeRound!.keys.insert(RecordKey(collection: collection, id: id2)) }
                }
            }
            switch admitData(delta, from: id, now: now, state: state) {
            case .refused(let actions): return actions
            case .admitted(let admitted): delta = admitted
            }
            // In place: a copy of the session would copy the batch array per chunk (quadratic in
            // the chunks of a round).
            sessions[id]!.batch.append(delta)
            sessions[id]!.batchBytes += delta.approximateWireBytes
            let last = index + 1 == count
            if last { sessions[id]!.firstRoundPending = false }
            var actions: [Action] = []
            if last || sessions[id]!.batchBytes >= settings.limits.catchUpBatchBytes {
                let (batch, bytes) = (sessions[id]!.batch, sessions[id]!.batchBytes)
                sessions[id]!.batch = []
                sessions[id]!.batchBytes = 0
                let completing = last ? sessions[id]!.completeRound : nil
                if last { sessions[id]!.completeRound = nil }
                queued.append(ApplyPart(session: id, deltas: batch, roundBytes: bytes, endsRound: last, origin: origin(of: sessions[id]!),
                                        completing: completing))
            }
            if let info = sessions[id]!.info {
                actions.append(.event(.catchUpProgress(info, chunk: clampedInt(index) + 1, chunks: clampedInt(count),
                                                       records: clampedInt(records))))
            }
            return actions
        case .applyDelta(var delta):
            lastActivity = now
            guard sessions[id]!.phase == .established else { return refuse(id, .notAdmitted, "data before admission", now: now) }
            if let refusal = ownNameRefusal(delta, state: state) { return refuse(id, .malformed, refusal, now: now) }
            switch admitData(delta, from: id, now: now, state: state) {
            case .refused(let actions): return actions
            case .admitted(let admitted): delta = admitted
            }
            queued.append(ApplyPart(session: id, deltas: [delta], endsRound: false, origin: origin(of: sessions[id]!)))
            return []
        case .acked(let context, let neighbors, let incremental):
            guard sessions[id]!.phase == .established else { return [] }
            sessions[id]!.delivered.merge(context)
            if incremental {
                var known = sessions[id]!.lastAckContext ?? sessions[id]!.peer?.context ?? CausalContext()
                known.merge(context)
                sessions[id]!.lastAckContext = known
            } else {
                sessions[id]!.lastAckContext = context
            }
            if let neighbors { sessions[id]!.neighbors = Set(neighbors) }
            // An ack is not a compaction report: only a signed report counts (PROTOCOL §19).
            return []
        case .digest(let digest, _):
            guard sessions[id]!.phase == .established, let info = sessions[id]!.info else { return [] }
            if digest == state.digest {
                sessions[id]!.lastConvergedAt = wallClock
                sessions[id]!.divergencePersists = false
                return [.event(.converged(info, digest: digest))]
            }
            // Another round after the next quiet period, with our context this time: then the
            // peer can tell a transient difference from a divergence.
            sessions[id]!.changedSinceDigest = true
            sessions[id]!.ackOwed = true
            guard sessions[id]!.lastAckContext == state.context else { return [] }
            // Equal events, different digests: a divergence. (Compaction cannot cause one: the
            // digest leaves deleted records out, so whether one is purged yet does not show.)
            return watchdog(id, info: info, now: now, state: state)
        case .breakdown(_, let theirs):
            guard let info = sessions[id]!.info else { return [] }
            let (collections, writers) = state.records.digestBreakdown().differences(from: theirs)
            sessions[id]!.divergence = (collections, writers)
            return [.log(CoreLog(.warning, "divergence with a peer", [
                        "peer.id": info.replicaID.shortDescription, "differs.collections": collections.joined(separator: ","),
                        "differs.writers": writers.map(\.shortDescription).joined(separator: ","),
                    ])),
                    .event(.divergenceDetail(info, collections: collections, writers: writers))]
        case .close(let reason, let text, let notifyPeer):
            if notifyPeer { return refuse(id, reason, text, now: now) } else if reason == .notAdmitted { peerRefusedUs(id) }
            var session = sessions[id]!
            session.close(with: nil, reason: .peerClosed(reason, detail: text), now: now)
            sessions[id] = session
            return [.log(CoreLog(.debug, "peer closed the session", sessionMetadata(session, ["reason": "\(reason)", "detail": text]))),
                    .closeTransport(id)]
        }
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
        guard sessions[id]!.lastRepairAt == nil else {
            guard !sessions[id]!.divergencePersists else { return [] }
            sessions[id]!.divergencePersists = true
            let (collections, writers) = sessions[id]!.divergence
            let records = sessions[id]!.echoesDropped.sorted()
            return [.log(CoreLog(.warning, "digests still differ after a full-state repair; not repairing again", [
                        "peer.id": info.replicaID.shortDescription, "peer.name": info.name,
                        "differs.collections": collections.joined(separator: ","),
                        "differs.writers": writers.map(\.shortDescription).joined(separator: ","),
                        "differs.records": records.map(\.description).joined(separator: ","),
                    ])),
                    .event(.divergencePersists(info, collections: collections, writers: writers, records: records))]
        }
        sessions[id]!.lastRepairAt = now
        sessions[id]!.out.push(catchUp: state.records)
        sessions[id]!.out.breakdownDue = true
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
