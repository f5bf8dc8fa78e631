@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncWire

/// Group commit (one commit in flight, the rest queued together), local changes and forwarding.
extension ReplicationCore {
    // MARK: - Commits

    struct CommitRequest {
        let id: UInt64
        let parts: [ApplyPart]
        var deltas: [RecordMap] { parts.flatMap(\.deltas) }
        /// Complete rounds that end in this commit (PROTOCOL §6.5).
        var completing: [CompleteRound] { parts.compactMap(\.completing) }
    }

    struct ApplyPart {
        let session: SessionID
        let deltas: [RecordMap]
        /// For chunks of a catch-up round, their approximate wire size (the session's
        /// `batchBytes`); nil for one live delta.
        var roundBytes: Int?
        /// The peer's last chunk of a round is in here: ack once committed.
        let endsRound: Bool
        let origin: String
        /// The round that ends here was complete: storage deletes what the peer's group purged.
        var completing: CompleteRound? = nil

        /// Chunks of a catch-up round (else one live delta).
        var fromRound: Bool { roundBytes != nil }
    }

    mutating func startCommitIfIdle(state: some ReplicaView, now: MonotonicInstant) -> [Action] {
        guard inFlight == nil, !queued.isEmpty else { return [] }
        if let hold = holdForRounds(now: now) { return hold }
        commitHeldSince = nil
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

    /// The hold of ``SyncTiming/roundCommitHold`` is over: commit what waits.
    mutating func commitDue(now: MonotonicInstant, state: some ReplicaView) -> [Action] {
        startCommitIfIdle(state: state, now: now)
    }

    /// Whether what is queued waits (the actions that start the wait, or none while it lasts),
    /// or nil to commit it now. Only whole catch-up rounds wait, only while another established
    /// session is in the middle of one, or a session past its peer's hello owes its first round
    /// (the hello showed events this replica lacks: when a partition heals, every peer's first
    /// round comes at once, while the last sessions are still being admitted), only while what
    /// has arrived fits in one batch (``SyncLimits/catchUpBatchBytes``), and at most
    /// ``SyncTiming/roundCommitHold``: a peer that stops halfway through its round delays the
    /// others' commit by that much, no more, and one that never sends its first round is not
    /// waited for after that one hold.
    private mutating func holdForRounds(now: MonotonicInstant) -> [Action]? {
        let limit = settings.timing.roundCommitHold
        guard limit > .zero, soloCommits == 0, queued.allSatisfy(\.fromRound) else { return nil }
        var bytes = 0
        var arriving = false
        for session in sessions.values {
            let link = session.link
            guard session.phase == .established && link?.batch.isEmpty == false
                || session.firstRoundPending && [.authenticating, .joining, .established].contains(session.phase) else { continue }
            arriving = true
            bytes += link?.batchBytes ?? 0
        }
        guard arriving else { return nil }
        for part in queued { bytes += part.roundBytes ?? 0 }
        guard bytes < settings.limits.catchUpBatchBytes else { return nil }
        guard let since = commitHeldSince else {
            commitHeldSince = now
            return [.commitAt(now + limit)]
        }
        if now - since < limit { return [] }
        // A first round still owed at the hold's end is not waited for again: a peer that
        // never sends it costs the others' rounds one hold, not one per commit.
        for id in sessions.keys where sessions[id]?.firstRoundPending == true { sessions[id]?.firstRoundPending = false }
        return nil
    }

    /// The in-flight commit is durable; `outcomes` has one entry per delta, in order; `state` is
    /// the state after it.
    mutating func committed(_ id: UInt64, outcomes: [MergeOutcome], state: some ReplicaView, now: MonotonicInstant) -> [Action] {
        guard let request = inFlight, request.id == id else { return [] }
        inFlight = nil
        lastActivity = now
        var actions: [Action] = []
        var index = 0
        for part in request.parts {
            var partOutcome = MergeOutcome()
            var news: [RecordMap] = []
            for delta in part.deltas {
                let outcome = index < outcomes.count ? outcomes[index] : MergeOutcome()
                index += 1
                partOutcome.absorb(outcome)
                sessions[part.session]?.withLink { link in
                    link.delivered.merge(delta.context)
                    for key in outcome.droppedEchoes where link.echoesDropped.count < 100 { link.echoesDropped.insert(key) }
                }
                let grew = !contextBeforeCommit.includes(delta.context)
                if !outcome.isEmpty || grew { news.append(delta) }
            }
            if part.fromRound {
                actions += forward(round: news, from: part.session, state: state, now: now)
            } else {
                for delta in news { actions += forward([delta], from: part.session, state: state) }
            }
            guard sessions[part.session] != nil else { continue }
            sessions[part.session]?.withLink { $0.changedSinceDigest = true }
            if part.endsRound {
                sessions[part.session]?.out.ackDue = true
                actions.append(.wake(part.session))
            }
            if !partOutcome.isEmpty, let info = sessions[part.session]?.info { actions.append(.event(.remoteChange(partOutcome, from: info))) }
        }
        actions += attachmentsReferenced(in: outcomes.lazy.flatMap { $0.changedRecords }, state: state)
        pruneProvisionalClaims()
        return actions + startCommitIfIdle(state: state, now: now)
    }

    /// The in-flight commit failed: nothing of it is stored. Its sessions are closed (their
    /// peers will send it again on the next session).
    ///
    /// `refused`: the store refused the data (it breaks a bound): the sending peer broke a rule.
    /// In a group commit of several sessions, each is retried alone so only the culprit is closed.
    mutating func commitFailed(_ id: UInt64, error: String, refused: Bool, now: MonotonicInstant, state: some ReplicaView) -> [Action] {
        guard let request = inFlight, request.id == id else { return [] }
        inFlight = nil
        if refused {
            if Set(request.parts.map(\.session)).count > 1 {
                queued = request.parts + queued
                soloCommits = request.parts.count
                return startCommitIfIdle(state: state, now: now)
            }
            var actions: [Action] = []
            for session in Set(request.parts.map(\.session)).sorted() { actions += refuse(session, .malformed, "refused: \(error)", now: now) }
            return actions + startCommitIfIdle(state: state, now: now)
        }
        var actions: [Action] = [.log(CoreLog(.error, "cannot store what peers sent; closing their sessions", ["error": error]))]
        for session in Set(request.parts.map(\.session)).sorted() {
            guard var s = sessions[session], s.phase != .closing else { continue }
            s.close(with: .error(.other, "the receiver's storage failed"), reason: .storageFailed(detail: error), now: now)
            sessions[session] = s
            actions.append(.wake(session))
        }
        return actions + startCommitIfIdle(state: state, now: now)
    }

    // MARK: - Local changes and forwarding

    /// A committed local change: to every established peer.
    mutating func broadcast(_ delta: RecordMap, state: some ReplicaView, now: MonotonicInstant) -> [Action] {
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
            sessions[id]?.out.resync = true
            sessions[id]?.withLink { $0.changedSinceDigest = true }
            actions.append(.wake(id))
        }
        return actions
    }

    /// Queues what a peer sent (`deltas`: one live delta; in full-state mode also a committed
    /// part of a catch-up round) to every other peer that may lack it — except a peer that made
    /// it or that is directly connected to every replica that made it (acks carry neighbour
    /// lists); the decision is the same for every delta of a part.
    mutating func forward(_ deltas: [RecordMap], from source: SessionID, state: some ReplicaView) -> [Action] {
        // Nothing to decide with no peer but the source.
        guard !deltas.isEmpty, established.values.contains(where: { $0 != source }) else { return [] }
        // The origins are the writers of the records' dots (for a live delta: its writer).
        let origins = Self.origins(of: deltas)
        var actions: [Action] = []
        for id in established.values.sorted() where id != source {
            guard let other = sessions[id] else { continue }
            if !origins.isEmpty, other.hearsDirectly(from: origins) { continue }
            let delivered = other.link?.delivered ?? CausalContext()
            var queued = false
            for delta in deltas where delta.context.isEmpty || !delivered.includes(delta.context) {
                enqueue(delta, to: id, state: state)
                queued = true
            }
            if queued { actions.append(.wake(id)) }
        }
        return actions
    }

    /// A committed part of a catch-up round from `source` (`news`: its chunks that added
    /// something). Its records are not forwarded as they are: each other peer that does not hear
    /// their writers directly is owed them, and after ``SyncTiming/roundRelayDelay`` gets a
    /// catch-up round of what it lacks then — or nothing, if by then its ack names the writers
    /// as neighbours (PROTOCOL §6.6). When a partition heals, the sessions come up one after
    /// another; forwarding at once sent each replica's changes twice (W3 over TLS: 50 B/op of
    /// forwarded deltas beside 62 of chunks). A round is the sender's own: a relay never
    /// carries its context, so a peer's context never covers records it was not sent.
    mutating func forward(round news: [RecordMap], from source: SessionID, state: some ReplicaView, now: MonotonicInstant) -> [Action] {
        // Full-state mode (benchmarks) sends its whole state on every change anyway.
        if settings.transfer == .fullState { return forward(news, from: source, state: state) }
        guard !news.isEmpty, established.values.contains(where: { $0 != source }) else { return [] }
        let writers = Self.origins(of: news)
        var actions: [Action] = []
        for id in established.values.sorted() where id != source {
            guard let other = sessions[id], writers.isEmpty || !other.hearsDirectly(from: writers) else { continue }
            let due = now + settings.timing.roundRelayDelay
            let relay = sessions[id]?.withLink { link -> Bool in
                link.relayWriters.formUnion(writers)
                guard link.relayDue == nil else { return false }
                link.relayDue = due
                return true
            }
            if relay == true { actions.append(.wakeAt(id, due)) }
        }
        return actions
    }

    /// The writers of the records' dots; for deltas without records, the replicas of their
    /// contexts. Not a round's context alone: it is the sender's whole context (every replica it
    /// ever heard of), and a round's chunks before its last carry none (PROTOCOL §6.5).
    static func origins(of deltas: [RecordMap]) -> Set<ReplicaID> {
        var origins = Set<ReplicaID>()
        for delta in deltas { origins.formUnion(writers(in: delta)) }
        if origins.isEmpty { for delta in deltas { origins.formUnion(delta.context.replicas) } }
        return origins
    }

    /// Every replica that made a dot of `delta`'s records (field writes, presence, removals).
    static func writers(in delta: RecordMap) -> Set<ReplicaID> {
        var writers = Set<ReplicaID>()
        for (_, records) in delta.collections {
            for record in records.values {
                for register in record.fields.values { writers.insert(register.dot.replica) }
                for (replica, entry) in record.presence {
                    writers.insert(replica)
                    if let remover = entry.removedBy { writers.insert(remover.replica) }
                }
            }
        }
        return writers
    }

    mutating func enqueue(_ delta: RecordMap, to id: SessionID, state: some ReplicaView) {
        sessions[id]?.withLink { $0.changedSinceDigest = true }
        // A round queued for this peer that was extracted after the commit already carries it:
        // a live copy would only race ahead of the round (a joiner cannot check the roster
        // entries of an admission before the round brings the entries of their signers).
        if let round = sessions[id]?.out.catchUp, !delta.context.isEmpty, round.context.includes(delta.context) { return }
        if settings.transfer == .fullState {
            sessions[id]?.out.push(catchUp: state.records, replacing: true)
        } else {
            sessions[id]?.out.push(delta: delta, limit: settings.limits.outboxDeltaBytes)
        }
    }
}
