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

    /// Queues a peer's delta to every other peer that lacks it — except a peer that made it or
    /// that is directly connected to every replica that made it (acks carry neighbour lists).
    mutating func forward(_ delta: RecordMap, from source: SessionID, state: ReplicaState) -> [Action] {
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

    mutating func enqueue(_ delta: RecordMap, to id: SessionID, state: ReplicaState) {
        sessions[id]!.changedSinceDigest = true
        if settings.transfer == .fullState {
            sessions[id]!.out.push(catchUp: state.records, replacing: true)
        } else {
            sessions[id]!.out.push(delta: delta, limit: settings.limits.outboxDeltaBytes)
        }
    }
}
