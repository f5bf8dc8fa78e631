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
    }

    enum Action {
        /// The session has bytes to send: its writer should call ``nextBatch``.
        case wake(SessionID)
        /// Close the session's transport now (without writing more).
        case closeTransport(SessionID)
        /// Persist these deltas in one transaction, then report ``committed`` or ``commitFailed``.
        case commit(CommitRequest)
        case event(NodeEvent)
        case log(CoreLog)
        /// An unknown device presented `entry` (an enrol with a valid invite, or a legacy enrol):
        /// write it to the roster as a local change, then report ``joinerAdmitted``.
        case admitJoiner(SessionID, RosterEntry)
        /// File work for attachments, on the shell's attachment queue (ReplicationCore+Attachments.swift).
        case attachmentIO(AttachmentIO)
    }

    struct CommitRequest {
        let id: UInt64
        let parts: [ApplyPart]
        var deltas: [RecordMap] { parts.flatMap(\.deltas) }
    }

    struct ApplyPart {
        let session: SessionID
        let deltas: [RecordMap]
        /// The peer's last chunk of a round is in here: ack once committed.
        let endsRound: Bool
        let origin: String
    }

    var settings: Settings
    /// The group's roster as the local state has it (``updateRoster``).
    private(set) var roster: Roster
    var sessions: [SessionID: PeerSession] = [:]
    private(set) var established: [ReplicaID: SessionID] = [:]
    private var nextSessionID: UInt64 = 1
    private var queued: [ApplyPart] = []
    private var inFlight: CommitRequest?
    /// Context before the in-flight commit: a delta that adds to it is forwarded.
    private var contextBeforeCommit = CausalContext()
    private var nextCommitID: UInt64 = 1
    private var shuttingDown = false
    /// Full-state repairs the convergence watchdog made.
    private(set) var repairs = 0
    /// After a refused group commit: parts still to commit one at a time (to find the culprit).
    private var soloCommits = 0
    /// When ``tick(now:)`` last ran.
    private var lastTick: MonotonicInstant?
    /// When data last moved: a delta or chunk received or sent, a commit, a local change. Digest
    /// rounds wait until the whole node has been quiet for ``SyncTiming/digestQuietPeriod``.
    private var lastActivity: MonotonicInstant?
    /// When the last digest round was due (rounds come at least every 10 quiet periods while busy).
    private var lastRound: MonotonicInstant?
    /// Log lines decided where returning actions is awkward; drained with the next actions.
    private var queuedLogs: [CoreLog] = []
    /// Attachment transfers (ReplicationCore+Attachments.swift).
    var attachmentState: AttachmentCoreState

    init(settings: Settings, roster: Roster) {
        self.settings = settings
        self.roster = roster
        attachmentState = AttachmentCoreState(limits: settings.limits)
    }

    private var skewMilliseconds: UInt64 { UInt64(max(0, settings.timing.maxClockSkew.wholeMilliseconds)) }

    // MARK: - Sessions opening and ending

    /// A transport is connected: creates the session and queues this side's hello.
    /// `nonce`: 16 random bytes the peer will sign.
    mutating func open(_ origin: SessionOrigin, now: MonotonicInstant, wallClock: UInt64, state: ReplicaState, nonce: [UInt8])
        -> (SessionID, [Action])
    {
        let id = SessionID(nextSessionID)
        nextSessionID += 1
        let hello = Hello(replicaID: settings.localReplica, name: settings.name, wallClockMilliseconds: wallClock,
                          context: state.context, maxFrameBytes: UInt64(settings.limits.maxFrameBytes), digest: state.digest,
                          groupID: settings.identity.groupID.bytes, deviceKey: settings.identity.key.publicKey.x963, nonce: nonce,
                          features: settings.attachments ? .attachments : [])
        var session = PeerSession(
            id: id, origin: origin,
            machine: SessionStateMachine(localReplica: settings.localReplica, maxClockSkewMilliseconds: skewMilliseconds),
            hello: hello, now: now)
        if shuttingDown {
            session.close(with: .goodbye(.shuttingDown, "node shutting down"), reason: .localShutdown, now: now)
        }
        sessions[id] = session
        return (id, [.wake(id)])
    }

    /// The transport ended (end of stream, error, or closed after a final frame).
    mutating func transportEnded(_ id: SessionID, reason: SessionEndReason) -> [Action] {
        guard let session = sessions[id] else { return [] }
        var actions = attachmentSessionEnded(id, session)
        sessions[id] = nil
        let why = session.endReason ?? reason
        if let peer = session.peer, established[peer.replicaID] == id {
            established[peer.replicaID] = nil
            actions += announceNeighbors()
        }
        if session.announced {
            // A session replaced by a duplicate leaves its peer connected: no disconnect then.
            if let info = session.info, established[info.replicaID] == nil {
                actions.append(.log(CoreLog(.info, "peer disconnected", ["peer.id": info.replicaID.shortDescription, "reason": "\(why)"])))
                actions.append(.event(.peerDisconnected(info, reason: why)))
            }
        } else if why != .duplicate {
            actions.append(.log(CoreLog(refusalLevel(why), "session refused", ["peer.address": session.origin.address, "reason": "\(why)"])))
            actions.append(.event(.sessionRefused(address: session.origin.address, reason: why)))
        }
        return actions
    }

    /// Whether a refused session is worth a line at info (a person can act on it) or debug
    /// (a peer that is simply not there).
    private func refusalLevel(_ reason: SessionEndReason) -> CoreLog.Level {
        switch reason {
        case .unreachable, .connectionLost, .localShutdown, .duplicate: .debug
        default: .warning
        }
    }

    /// A frame could not be read: over the limit, or a malformed length.
    mutating func frameError(_ id: SessionID, _ error: WireError, now: MonotonicInstant) -> [Action] {
        let reason: CloseReason = if case .frameTooLarge = error { .frameTooLarge } else { .malformed }
        return refuse(id, reason, "\(error)", now: now)
    }

    /// Closes a session from this side with an error frame (best effort) and a log line.
    mutating func refuse(_ id: SessionID, _ reason: CloseReason, _ detail: String, now: MonotonicInstant) -> [Action] {
        guard var session = sessions[id], session.phase != .closing else { return [] }
        session.close(with: .error(reason, detail), reason: .refused(reason, detail: detail), now: now)
        sessions[id] = session
        return [.log(CoreLog(.warning, "closing session: \(reason)", sessionMetadata(session, ["reason": detail]))), .wake(id)]
    }

    /// This side ends one session: a goodbye after what is already queued.
    mutating func closeLocally(_ id: SessionID, now: MonotonicInstant) -> [Action] {
        guard var session = sessions[id], session.phase != .closing else { return [] }
        session.close(with: .goodbye(.normal, "session closed"), reason: .localShutdown, flushFirst: true, now: now)
        sessions[id] = session
        return [.wake(id)]
    }

    /// Local shutdown: a goodbye to every session after what is already queued.
    mutating func shutdown(now: MonotonicInstant) -> [Action] {
        shuttingDown = true
        var actions: [Action] = []
        for id in sessions.keys.sorted() {
            guard var session = sessions[id], session.phase != .closing else { continue }
            session.close(with: .goodbye(.shuttingDown, "node shutting down"), reason: .localShutdown, flushFirst: true, now: now)
            sessions[id] = session
            actions.append(.wake(id))
        }
        return actions
    }

    // MARK: - Inbound frames

    /// One frame from a session's peer, received when the wall clock read `wallClock`.
    mutating func receive(
        _ id: SessionID, type: UInt8, body: [UInt8], now: MonotonicInstant, wallClock: UInt64, state: ReplicaState
    ) -> [Action] {
        guard var session = sessions[id], session.phase != .closing else { return [] }
        session.lastReceived = now
        session.framesReceived += 1
        session.bytesReceived += body.count + 1 + Varint.size(of: UInt64(body.count + 1))
        if readsAttachmentMessage(type) {
            sessions[id] = session
            return receiveAttachment(id, type: type, body: body, now: now)
        }
        let decisions = session.machine.receive(type: type, body: body, now: wallClock)
        sessions[id] = session
        var actions: [Action] = []
        for decision in decisions {
            actions += carryOut(decision, session: id, now: now, wallClock: wallClock, state: state)
            if sessions[id] == nil || sessions[id]!.phase == .closing { break }
        }
        actions += queuedLogs.map { .log($0) }
        queuedLogs = []
        return actions + startCommitIfIdle(state: state)
    }

    private mutating func carryOut(
        _ decision: SessionStateMachine.Action, session id: SessionID, now: MonotonicInstant, wallClock: UInt64,
        state: ReplicaState
    ) -> [Action] {
        switch decision {
        case .send(.pong(let nonce)):
            sessions[id]!.out.pong = nonce
            return [.wake(id)]
        case .send:
            return []
        case .established(let hello):
            return authenticate(id, hello: hello, now: now)
        case .auth(let signature):
            return admit(id, signature: signature, now: now, state: state)
        case .join(let entry):
            return join(id, entry: entry, now: now, wallClock: wallClock)
        case .applyChunk(var delta, let index, let count, let records):
            lastActivity = now
            guard sessions[id]!.phase == .established else { return refuse(id, .notAdmitted, "data before admission", now: now) }
            if let refusal = ownNameRefusal(delta, state: state) { return refuse(id, .malformed, refusal, now: now) }
            switch admitData(delta, from: id, now: now) {
            case .refused(let actions): return actions
            case .admitted(let admitted): delta = admitted
            }
            var session = sessions[id]!
            session.batch.append(delta)
            session.batchBytes += delta.approximateWireBytes
            let last = index + 1 == count
            var actions: [Action] = []
            if last || session.batchBytes >= settings.limits.catchUpBatchBytes {
                queued.append(ApplyPart(session: id, deltas: session.batch, endsRound: last, origin: origin(of: session)))
                session.batch = []
                session.batchBytes = 0
            }
            sessions[id] = session
            if let info = session.info {
                actions.append(.event(.catchUpProgress(info, chunk: clampedInt(index) + 1, chunks: clampedInt(count),
                                                       records: clampedInt(records))))
            }
            return actions
        case .applyDelta(var delta):
            lastActivity = now
            guard sessions[id]!.phase == .established else { return refuse(id, .notAdmitted, "data before admission", now: now) }
            if let refusal = ownNameRefusal(delta, state: state) { return refuse(id, .malformed, refusal, now: now) }
            switch admitData(delta, from: id, now: now) {
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
            return []
        case .digest(let digest, _):
            guard sessions[id]!.phase == .established, let info = sessions[id]!.info else { return [] }
            if digest == state.digest {
                sessions[id]!.lastConvergedAt = wallClock
                return [.event(.converged(info, digest: digest))]
            }
            // Another round after the next quiet period, with our context this time: then the
            // peer can tell a transient difference from a divergence.
            sessions[id]!.changedSinceDigest = true
            sessions[id]!.ackOwed = true
            guard sessions[id]!.lastAckContext == state.context else { return [] }
            return watchdog(id, info: info, now: now, state: state)
        case .breakdown(_, let theirs):
            guard let info = sessions[id]!.info else { return [] }
            let (collections, writers) = state.records.digestBreakdown().differences(from: theirs)
            return [.log(CoreLog(.warning, "divergence with a peer", [
                        "peer.id": info.replicaID.shortDescription, "differs.collections": collections.joined(separator: ","),
                        "differs.writers": writers.map(\.shortDescription).joined(separator: ","),
                    ])),
                    .event(.divergenceDetail(info, collections: collections, writers: writers))]
        case .close(let reason, let text, let notifyPeer):
            if notifyPeer { return refuse(id, reason, text, now: now) }
            var session = sessions[id]!
            session.close(with: nil, reason: .peerClosed(reason, detail: text), now: now)
            sessions[id] = session
            return [.log(CoreLog(.debug, "peer closed the session", sessionMetadata(session, ["reason": "\(reason)", "detail": text]))),
                    .closeTransport(id)]
        }
    }

    /// The convergence watchdog: both sides claim the same events but their states differ — a bug
    /// here or in the peer's implementation, or a store restored under the same replica ID. Each
    /// side sends its full state (joining heals any such split), and its digest breakdown so the
    /// other can log where they differed. At most one repair a minute per session.
    private mutating func watchdog(_ id: SessionID, info: PeerInfo, now: MonotonicInstant, state: ReplicaState) -> [Action] {
        if let last = sessions[id]!.lastRepairAt, now - last < .seconds(60) { return [] }
        sessions[id]!.lastRepairAt = now
        sessions[id]!.out.push(catchUp: state.records)
        sessions[id]!.out.breakdownDue = true
        repairs += 1
        return [.log(CoreLog(.warning, "digests differ although both sides hold the same events; repairing by a full-state exchange",
                             ["peer.id": info.replicaID.shortDescription, "repairs": "\(repairs)"])),
                .event(.divergenceRepaired(info, repairs: repairs)),
                .wake(id)]
    }

    /// A peer may echo writes in this replica's name, but never ones it did not make.
    private func ownNameRefusal(_ delta: RecordMap, state: ReplicaState) -> String? {
        let issued = state.context.maxCounter(of: settings.localReplica)
        guard let claimed = delta.highestCounter(of: settings.localReplica), claimed > issued else { return nil }
        return "the delta holds a write by this replica (counter \(claimed)) that it never made (its last is \(issued))"
    }

    // MARK: - Authentication and admission

    /// The peer's hello passed the protocol checks: check its group and device key, and prove
    /// our own key (auth). The session waits for the peer's auth.
    private mutating func authenticate(_ id: SessionID, hello: Hello, now: MonotonicInstant) -> [Action] {
        let group = settings.identity.groupID
        guard hello.groupID == group.bytes else {
            return refuse(id, .notAdmitted, "the peer belongs to another sync group", now: now)
        }
        guard let key = hello.deviceKey.flatMap(DevicePublicKey.init(x963:)) else {
            return refuse(id, .malformed, "the hello's device key is not a P-256 point", now: now)
        }
        var session = sessions[id]!
        if let transport = session.origin.transportDevice, transport != key.deviceID {
            return refuse(id, .notAdmitted, "the hello's device key is not the one the TLS certificate carries", now: now)
        }
        session.peerKey = key
        session.phase = .authenticating
        session.out.auth = SessionAuth.sign(key: settings.identity.key, ownNonce: session.nonce, peerNonce: hello.nonce ?? [],
                                            own: settings.localReplica, group: group)
        sessions[id] = session
        return [.wake(id)]
    }

    /// The peer's auth: verify it, then ask the roster.
    private mutating func admit(_ id: SessionID, signature: [UInt8], now: MonotonicInstant, state: ReplicaState) -> [Action] {
        let session = sessions[id]!
        guard session.phase == .authenticating, let key = session.peerKey, let hello = session.peer else {
            return refuse(id, .malformed, "auth out of place", now: now)
        }
        guard SessionAuth.verify(signature, key: key, peerNonce: hello.nonce ?? [], ownNonce: session.nonce,
                                 peer: hello.replicaID, group: settings.identity.groupID) else {
            return refuse(id, .notAdmitted, "authentication failed: the peer does not hold the device key it names", now: now)
        }
        // A device of a group upgraded from a shared secret enrolled itself, offline: a peer that
        // has not seen that entry yet learns it here (to a peer that has, it is harmless).
        if settings.identity.legacySecret != nil, let enrol = ownLegacyEnrol {
            sessions[id]!.out.join = enrol
        }
        switch roster.admission(of: key.deviceID, pendingJoin: settings.identity.pendingJoin) {
        case .refused(let reason, let text):
            return refuse(id, reason, text, now: now)
        case .candidate:
            sessions[id]!.phase = .joining
            let asked = CoreLog(.info, "an unknown device asks to join", sessionMetadata(session, ["peer.device": key.deviceID.shortForm]))
            // Our own legacy enrolment (set above) goes out now: the peer may not know us either.
            return sessions[id]!.out.join == nil ? [.log(asked)] : [.log(asked), .wake(id)]
        case .member:
            var actions = register(id, hello: hello, now: now, state: state)
            if let join = settings.identity.pendingJoin, key.deviceID == join.inviter, sessions[id]?.phase == .established {
                sessions[id]!.out.join = join.entry
                actions.append(.wake(id))
            }
            return actions
        }
    }

    /// This device's legacy enrolment entry, if it has one.
    private var ownLegacyEnrol: [UInt8]? {
        let me = settings.identity.key.deviceID
        return roster.entries.values.first { $0.kind == .legacyEnrol && $0.signer == me }?.bytes
    }

    /// An unknown device presents the roster entry that should admit it.
    private mutating func join(_ id: SessionID, entry bytes: [UInt8], now: MonotonicInstant, wallClock: UInt64) -> [Action] {
        let session = sessions[id]!
        guard session.phase == .joining, let device = session.peerKey?.deviceID else {
            // A joiner sends its entry once admitted by its inviter; elsewhere it is harmless.
            return session.phase == .established ? [] : refuse(id, .malformed, "join out of place", now: now)
        }
        let entry: RosterEntry
        do {
            entry = try RosterEntry(bytes: bytes)
        } catch {
            return refuse(id, .notAdmitted, "the join entry is malformed: \(error)", now: now)
        }
        guard entry.signer == device, entry.groupID == settings.identity.groupID else {
            return refuse(id, .notAdmitted, "the join entry is not this device's, for this group", now: now)
        }
        switch entry.payload {
        case .enrol(let token, _):
            if let refusal = roster.joinRefusal(token: token, now: wallClock) { return refuse(id, .notAdmitted, refusal, now: now) }
        case .legacyEnrol:
            break
        default:
            return refuse(id, .notAdmitted, "a join needs an enrol entry, got \(entry.kind)", now: now)
        }
        let after = roster.adding([entry])
        guard after.isActive(device) else {
            let reason = after.ineffective.first { $0.entry.id == entry.id }?.reason ?? "the roster does not admit it"
            return refuse(id, .notAdmitted, reason, now: now)
        }
        return [.log(CoreLog(.info, "admitting a new device", sessionMetadata(session, ["peer.device": device.shortForm]))),
                .admitJoiner(id, entry)]
    }

    /// The joiner's entry is committed (and in `roster`): the session becomes a member's.
    mutating func joinerAdmitted(_ id: SessionID, roster: Roster, now: MonotonicInstant, state: ReplicaState) -> [Action] {
        self.roster = roster
        guard let session = sessions[id], session.phase == .joining, let hello = session.peer else { return [] }
        return register(id, hello: hello, now: now, state: state) + startCommitIfIdle(state: state)
    }

    /// The roster changed (a local or a peer's entry): sessions of devices no longer active end.
    mutating func updateRoster(_ roster: Roster, identity: LocalIdentity, now: MonotonicInstant) -> [Action] {
        self.roster = roster
        settings.identity = identity
        var actions: [Action] = []
        for id in sessions.keys.sorted() {
            guard let session = sessions[id], session.phase == .established, let device = session.peerKey?.deviceID else { continue }
            if case .refused(let reason, let text) = roster.admission(of: device, pendingJoin: identity.pendingJoin) {
                actions += refuse(id, reason, text, now: now)
            }
        }
        return actions
    }

    enum DataAdmission {
        case admitted(RecordMap)
        case refused([Action])
    }

    /// Roster entries in a peer's delta must be well formed and authorised; a removed device's
    /// writes beyond its cutoff are dropped (their dots stay known, so nobody offers them again).
    private mutating func admitData(_ delta: RecordMap, from id: SessionID, now: MonotonicInstant) -> DataAdmission {
        if let violation = delta.limitViolation {
            return .refused(refuse(id, .malformed, "the delta breaks a limit: \(violation)", now: now))
        }
        if delta.touchesRoster {
            let validation = roster.validate(delta: delta)
            if let refusal = validation.refused.first {
                let hostile = validation.hasMalformed
                return .refused(refuse(id, hostile ? .malformed : .other,
                                       hostile ? "roster entry refused: \(refusal)"
                                               : "roster entries arrived before the entries that authorise them (\(refusal)); try again",
                                       now: now))
            }
        }
        guard let (stripped, count) = delta.strippingRefused(by: roster) else { return .admitted(delta) }
        if let session = sessions[id] {
            queuedLogs.append(CoreLog(.info, "dropped writes of a removed device", sessionMetadata(session, ["writes": "\(count)"])))
        }
        return .admitted(stripped)
    }

    private func origin(of session: PeerSession) -> String {
        "peer:" + (session.peer?.replicaID.shortDescription ?? session.origin.address)
    }

    /// Admits an established session under the duplicate rule and queues its catch-up.
    private mutating func register(_ id: SessionID, hello: Hello, now: MonotonicInstant, state: ReplicaState) -> [Action] {
        var actions: [Action] = []
        let issued = state.context.maxCounter(of: settings.localReplica)
        let known = hello.context.maxCounter(of: settings.localReplica)
        if known > issued {
            // The peer has writes in our name we do not: this store was restored from an older copy
            // (or copied, and the copy wrote). Writing on under this ID would reuse dots.
            let info = PeerInfo(replicaID: hello.replicaID, name: hello.name, address: sessions[id]!.origin.address,
                                dialed: sessions[id]!.origin.initiator)
            return refuse(id, .replicaRestored, "the peer knows \(known) writes by this replica, this store has \(issued)", now: now)
                + [.event(.restoredStoreDetected(info, replica: settings.localReplica, peerKnows: known, localHas: issued))]
        }
        if established[hello.replicaID] == nil, established.count >= settings.limits.sessions {
            return refuse(id, .overloaded, "this node has \(established.count) sessions, its limit", now: now)
        }
        if let existingID = established[hello.replicaID], let existing = sessions[existingID] {
            // Of two sessions between one pair, the one dialed by the lower replica ID survives
            // (if both were dialed by the same side, the newer one); both ends decide alike.
            let newDialer = sessions[id]!.origin.initiator ? settings.localReplica : hello.replicaID
            let oldDialer = existing.origin.initiator ? settings.localReplica : hello.replicaID
            let keepNew = newDialer == oldDialer ? true : newDialer < oldDialer
            let loser = keepNew ? existingID : id
            var session = sessions[loser]!
            session.close(with: .goodbye(.duplicateConnection, "another connection to this peer is kept"), reason: .duplicate, now: now)
            sessions[loser] = session
            actions.append(.wake(loser))
            if !keepNew { return actions }
            established[hello.replicaID] = nil
        }
        var session = sessions[id]!
        session.phase = .established
        session.peerMaxFrame = Int(min(hello.maxFrameBytes, UInt64(Int32.max)))
        session.delivered.merge(hello.context)
        let extract = settings.transfer == .fullState ? state.records : state.delta(missingFrom: hello.context)
        session.out.push(catchUp: extract)
        sessions[id] = session
        session.announced = true
        sessions[id] = session
        established[hello.replicaID] = id
        actions += announceNeighbors()
        actions += attachmentPeerAdmitted(id, hello: hello, state: state)
        if let info = session.info {
            actions.append(.log(CoreLog(.info, "peer connected", ["peer.id": hello.replicaID.shortDescription, "peer.name": hello.name,
                                                                   "peer.dialed": "\(session.origin.initiator)"])))
            actions.append(.event(.peerConnected(info)))
        }
        return actions
    }

    /// The replicas with an established session, sorted.
    var neighborList: [ReplicaID] { established.keys.sorted() }

    /// Tells every peer whom this node is connected to now, so they forward only what it lacks.
    private mutating func announceNeighbors() -> [Action] {
        var actions: [Action] = []
        for id in established.values.sorted() {
            sessions[id]!.out.ackDue = true
            actions.append(.wake(id))
        }
        return actions
    }

    // MARK: - Commits

    private mutating func startCommitIfIdle(state: ReplicaState) -> [Action] {
        guard inFlight == nil, !queued.isEmpty else { return [] }
        let parts: [ApplyPart]
        if soloCommits > 0 {
            soloCommits -= 1
            parts = [queued.removeFirst()]
        } else {
            parts = queued
            queued = []
        }
        let request = CommitRequest(id: nextCommitID, parts: parts)
        nextCommitID += 1
        inFlight = request
        contextBeforeCommit = state.context
        return [.commit(request)]
    }

    /// The in-flight commit is durable; `outcomes` has one entry per delta, in order; `state` is
    /// the state after it.
    mutating func committed(_ id: UInt64, outcomes: [MergeOutcome], state: ReplicaState, now: MonotonicInstant) -> [Action] {
        guard let request = inFlight, request.id == id else { return [] }
        inFlight = nil
        lastActivity = now
        var actions: [Action] = []
        var index = 0
        for part in request.parts {
            var partOutcome = MergeOutcome()
            for delta in part.deltas {
                let outcome = index < outcomes.count ? outcomes[index] : MergeOutcome()
                index += 1
                partOutcome.absorb(outcome)
                sessions[part.session]?.delivered.merge(delta.context)
                let grew = !contextBeforeCommit.includes(delta.context)
                if !outcome.isEmpty || grew { actions += forward(delta, from: part.session, state: state) }
            }
            guard var session = sessions[part.session] else { continue }
            session.changedSinceDigest = true
            if part.endsRound {
                session.out.ackDue = true
                actions.append(.wake(part.session))
            }
            sessions[part.session] = session
            if !partOutcome.isEmpty, let info = session.info { actions.append(.event(.remoteChange(partOutcome, from: info))) }
        }
        actions += attachmentsReferenced(in: outcomes.lazy.flatMap { $0.changedRecords }, state: state)
        return actions + startCommitIfIdle(state: state)
    }

    /// The in-flight commit failed: nothing of it is stored. Its sessions are closed (their
    /// peers will send it again on the next session).
    ///
    /// `refused`: the store refused the data (it breaks a bound): the sending peer broke a rule.
    /// In a group commit of several sessions, each is retried alone so only the culprit is closed.
    mutating func commitFailed(_ id: UInt64, error: String, refused: Bool, now: MonotonicInstant, state: ReplicaState) -> [Action] {
        guard let request = inFlight, request.id == id else { return [] }
        inFlight = nil
        if refused {
            if Set(request.parts.map(\.session)).count > 1 {
                queued = request.parts + queued
                soloCommits = request.parts.count
                return startCommitIfIdle(state: state)
            }
            var actions: [Action] = []
            for session in Set(request.parts.map(\.session)).sorted() { actions += refuse(session, .malformed, "refused: \(error)", now: now) }
            return actions + startCommitIfIdle(state: state)
        }
        var actions: [Action] = [.log(CoreLog(.error, "cannot store what peers sent; closing their sessions", ["error": error]))]
        for session in Set(request.parts.map(\.session)).sorted() {
            guard var s = sessions[session], s.phase != .closing else { continue }
            s.close(with: .error(.other, "the receiver's storage failed"), reason: .storageFailed(detail: error), now: now)
            sessions[session] = s
            actions.append(.wake(session))
        }
        return actions + startCommitIfIdle(state: state)
    }

    // MARK: - Local changes and forwarding

    /// A committed local change: to every established peer.
    mutating func broadcast(_ delta: RecordMap, state: ReplicaState, now: MonotonicInstant) -> [Action] {
        if !established.isEmpty { lastActivity = now }
        var actions: [Action] = []
        for id in established.values.sorted() {
            enqueue(delta, to: id, state: state)
            actions.append(.wake(id))
        }
        return actions + attachmentsReferenced(in: delta.allRecords.lazy.map { $0.0 }, state: state)
    }

    /// The local state was reloaded (another process rewrote much of the store): every peer gets
    /// what it lacks according to what it is known to have.
    mutating func resyncAll() -> [Action] {
        var actions: [Action] = []
        for id in established.values.sorted() {
            sessions[id]!.out.resync = true
            sessions[id]!.changedSinceDigest = true
            actions.append(.wake(id))
        }
        return actions
    }

    /// Queues a peer's delta to every other peer that lacks it — except a peer that made it or
    /// that is directly connected to every replica that made it (acks carry neighbour lists).
    private mutating func forward(_ delta: RecordMap, from source: SessionID, state: ReplicaState) -> [Action] {
        var actions: [Action] = []
        let origins = delta.context.replicas
        for id in established.values.sorted() where id != source {
            let other = sessions[id]!
            if !delta.context.isEmpty && other.delivered.includes(delta.context) { continue }
            if !origins.isEmpty, let peer = other.peer?.replicaID,
               origins.allSatisfy({ $0 == peer || (other.neighbors?.contains($0) ?? false) }) { continue }
            enqueue(delta, to: id, state: state)
            actions.append(.wake(id))
        }
        return actions
    }

    private mutating func enqueue(_ delta: RecordMap, to id: SessionID, state: ReplicaState) {
        sessions[id]!.changedSinceDigest = true
        if settings.transfer == .fullState {
            sessions[id]!.out.push(catchUp: state.records, replacing: true)
        } else {
            sessions[id]!.out.push(delta: delta, limit: settings.limits.outboxDeltaBytes)
        }
    }

    // MARK: - Timer

    /// The node's one timer: keepalives, acks and digests when quiet, dead peers, handshakes
    /// that never finish, closings that never flush.
    mutating func tick(now: MonotonicInstant) -> [Action] {
        var actions: [Action] = []
        let timing = settings.timing
        // A node whose own timer ran late (its process starved of CPU, or suspended) did not hear
        // from its peers for the same reason: the stall beyond a few ticks is not their silence.
        if let last = lastTick, now - last > timing.tick * 10 {
            let stall = now - last - timing.tick
            for id in sessions.keys {
                sessions[id]!.lastReceived = min(now, sessions[id]!.lastReceived + stall)
                sessions[id]!.openedAt = min(now, sessions[id]!.openedAt + stall)
                if let since = sessions[id]!.closingSince { sessions[id]!.closingSince = min(now, since + stall) }
            }
        }
        lastTick = now
        // Digest rounds are the node's, not each session's: once nothing has moved anywhere for a
        // quiet period (or, while busy, every 10 of them), every session that carried a change
        // sends one digest — with an ack only if the peer's last digest differed from ours.
        let quiet = lastActivity.map { now - $0 >= timing.digestQuietPeriod } ?? true
        let roundDue = quiet || lastRound.map { now - $0 >= timing.digestQuietPeriod * 10 } ?? false
        if roundDue || lastRound == nil { lastRound = now }
        for id in sessions.keys.sorted() {
            var session = sessions[id]!
            switch session.phase {
            case .closing:
                if let since = session.closingSince, now - since >= timing.closeDrainTimeout {
                    actions.append(.closeTransport(id))
                }
            case .awaitingHello, .authenticating, .joining:
                if now - session.openedAt >= timing.handshakeTimeout {
                    let what = session.phase == .awaitingHello ? "no hello" : "no admission"
                    actions += refuse(id, .timeout, "\(what) within \(formatSeconds(timing.handshakeTimeout.millisecondsDouble / 1000))", now: now)
                    continue
                }
            case .established:
                let silence = now - session.lastReceived
                if silence >= timing.deadPeerTimeout {
                    actions += refuse(id, .timeout, "no frame for \(formatSeconds(silence.millisecondsDouble / 1000))", now: now)
                    continue
                }
                if session.changedSinceDigest, roundDue {
                    session.changedSinceDigest = false
                    session.out.digestDue = true
                    if session.ackOwed {
                        session.ackOwed = false
                        session.out.ackDue = true
                    }
                    actions.append(.wake(id))
                } else if now - session.lastSent >= timing.keepaliveInterval, session.out.ping == nil {
                    session.nextNonce += 1
                    session.out.ping = session.nextNonce
                    actions.append(.wake(id))
                }
                sessions[id] = session
            }
        }
        return actions + attachmentTick(now: now)
    }

    // MARK: - Outbound

    /// The next bytes for a session's transport (nil: nothing now). `skipped` reports fields too
    /// large for the peer's frames.
    mutating func nextBatch(_ id: SessionID, budget: Int, now: MonotonicInstant, state: ReplicaState) -> (OutboundBatch?, [Action]) {
        guard var session = sessions[id] else { return (nil, []) }
        var actions: [Action] = []
        if session.out.deltas != nil || session.out.catchUp != nil || session.out.nextCatchUp != nil || session.out.resync {
            lastActivity = now
        }
        let neighbors = neighborList
        let address = session.origin.address
        let batch = session.nextBatch(
            budget: budget, state: state, neighbors: neighbors, chunkTarget: settings.limits.chunkTargetBytes, now: now
        ) { key, field in
            actions.append(.log(CoreLog(.warning, "a field is too large for the peer's frames and is not sent to it",
                                        ["record": "\(key)", "field": field, "peer.address": address])))
        }
        sessions[id] = session
        return (appendAttachmentFrames(id, to: batch, budget: budget, now: now), actions)
    }

    /// Whether the session has anything queued.
    func hasOutput(_ id: SessionID) -> Bool { sessions[id]?.out.hasWork ?? false }

    // MARK: - Status

    func peerStatuses() -> [(PeerInfo, lastConvergedAt: UInt64?, bytesSent: Int, bytesReceived: Int)] {
        established.values.sorted().compactMap { id in
            guard let session = sessions[id], let info = session.info else { return nil }
            return (info, session.lastConvergedAt, session.bytesSent, session.bytesReceived)
        }
    }

    func session(_ id: SessionID) -> PeerSession? { sessions[id] }

    func sessionMetadata(_ session: PeerSession, _ extra: [String: String]) -> [String: String] {
        var metadata = extra
        metadata["peer.address"] = session.origin.address
        if let peer = session.peer { metadata["peer.id"] = peer.replicaID.shortDescription }
        return metadata
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
