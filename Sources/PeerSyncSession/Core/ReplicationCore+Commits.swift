import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncWire

/// Group commit (one commit in flight, the rest queued together), local changes and forwarding.
extension ReplicationCore {
    // MARK: - Commits

    mutating func startCommitIfIdle(state: ReplicaState) -> [Action] {
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
            var news: [RecordMap] = []
            for delta in part.deltas {
                let outcome = index < outcomes.count ? outcomes[index] : MergeOutcome()
                index += 1
                partOutcome.absorb(outcome)
                sessions[part.session]?.delivered.merge(delta.context)
                let grew = !contextBeforeCommit.includes(delta.context)
                if !outcome.isEmpty || grew { news.append(delta) }
            }
            if part.fromRound {
                actions += forward(round: news, whole: news.count == part.deltas.count, ends: part.endsRound,
                                   from: part.session, state: state)
            } else {
                for delta in news { actions += forward([delta], from: part.session, state: state) }
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
        pruneProvisionalClaims()
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

    /// Queues what a peer sent (`deltas`: one live delta, or a committed part of a catch-up
    /// round) to every other peer that may lack it — except a peer that made it or that is
    /// directly connected to every replica that made it (acks carry neighbour lists); the
    /// decision is the same for every delta of a part. Returns the peers it was queued to.
    @discardableResult
    mutating func forward(_ deltas: [RecordMap], from source: SessionID, state: ReplicaState,
                          stripContextFor strip: Set<SessionID> = [], actions: inout [Action]) -> Set<SessionID> {
        // Nothing to decide with no peer but the source (the writers walk a whole round).
        guard !deltas.isEmpty, established.values.contains(where: { $0 != source }) else { return [] }
        // The origins are the writers of the records' dots, not the replicas of the context: a
        // catch-up round's context is the sender's whole context (every replica it ever heard
        // of), and a round's chunks before its last carry none (PROTOCOL §6.5). Either way the
        // rule below never held for a round, and healing a partition of three sent each
        // replica's changes twice (W3 over TLS). For a live write both are the writer.
        var origins = Set<ReplicaID>()
        for delta in deltas { origins.formUnion(Self.writers(in: delta)) }
        if origins.isEmpty { for delta in deltas { origins.formUnion(delta.context.replicas) } }
        var sent = Set<SessionID>()
        for id in established.values.sorted() where id != source {
            let other = sessions[id]!
            if !origins.isEmpty, let peer = other.peer?.replicaID,
               origins.allSatisfy({ $0 == peer || (other.neighbors?.contains($0) ?? false) }) { continue }
            var queued = false
            for delta in deltas {
                if !delta.context.isEmpty && other.delivered.includes(delta.context) { continue }
                if strip.contains(id) && !delta.context.isEmpty {
                    // The records alone: the context also covers parts this peer was not sent.
                    enqueue(RecordMap(records: delta.allRecords, context: CausalContext(), maintainingDigest: false), to: id, state: state)
                } else {
                    enqueue(delta, to: id, state: state)
                }
                queued = true
            }
            if queued {
                sent.insert(id)
                actions.append(.wake(id))
            }
        }
        return sent
    }

    mutating func forward(_ deltas: [RecordMap], from source: SessionID, state: ReplicaState) -> [Action] {
        var actions: [Action] = []
        forward(deltas, from: source, state: state, actions: &actions)
        return actions
    }

    /// Forwards a committed part of a catch-up round from `source` (`news`: its chunks that
    /// added something; `whole`: all of them did). A peer is sent a round's context (its last
    /// chunk) only if it was sent every chunk of the round: a context covers the whole round,
    /// and a peer holding it without the records would tell everyone it has them.
    mutating func forward(round news: [RecordMap], whole: Bool, ends: Bool, from source: SessionID,
                          state: ReplicaState) -> [Action] {
        var actions: [Action] = []
        let others = Set(established.values).subtracting([source])
        let strip = ends ? (sessions[source]?.roundNotForwardedTo ?? []) : []
        let sent = forward(news, from: source, state: state, stripContextFor: whole ? strip : others, actions: &actions)
        if ends {
            sessions[source]?.roundNotForwardedTo = []
        } else {
            let missed = whole ? others.subtracting(sent) : others
            sessions[source]?.roundNotForwardedTo.formUnion(missed)
        }
        return actions
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

    mutating func enqueue(_ delta: RecordMap, to id: SessionID, state: ReplicaState) {
        sessions[id]!.changedSinceDigest = true
        if settings.transfer == .fullState {
            sessions[id]!.out.push(catchUp: state.records, replacing: true)
        } else {
            sessions[id]!.out.push(delta: delta, limit: settings.limits.outboxDeltaBytes)
        }
    }
}
