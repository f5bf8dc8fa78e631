@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncWire

/// Authentication and admission: hello → auth → the roster's verdict (member, joiner or
/// refused), joins, roster changes, and registering an established session.
extension ReplicationCore {
    // MARK: - Authentication and admission

    /// The peer's hello passed the protocol checks: check its group and device key, and prove
    /// our own key (auth). The session waits for the peer's auth.
    mutating func authenticate(_ id: SessionID, hello: Hello, now: MonotonicInstant, state: some ReplicaView) -> [Action] {
        guard var session = sessions[id] else { return [] }
        session.outbound.relativeEventCounters = hello.features.contains(.eventCounters)
        // The hello is the session's from here on, also if it is refused below (its logs name the peer).
        var handshake = PeerSession.Handshake(hello: hello)
        session.state = .authenticating(handshake)
        sessions[id] = session
        let group = settings.identity.groupID
        guard hello.groupID == group.bytes else {
            return refuse(id, .notAdmitted, "the peer belongs to another sync group", now: now)
        }
        guard let key = hello.deviceKey.flatMap(DevicePublicKey.init(x963:)) else {
            return refuse(id, .malformed, "the hello's device key is not a P-256 point", now: now)
        }
        if let transport = session.origin.transportDevice, transport != key.deviceID {
            return refuse(id, .notAdmitted, "the hello's device key is not the one the TLS certificate carries", now: now)
        }
        handshake.key = key
        session.state = .authenticating(handshake)
        session.out.auth = SessionAuth.sign(key: settings.identity.key, ownNonce: session.nonce, peerNonce: hello.nonce ?? [],
                                            own: settings.localReplica, group: group)
        // The peer's store lacks writes in its own name that this node holds: it was put back
        // from a backup. Say how recent they are, so it can tell its own writes since the
        // restore from older ones (PROTOCOL §6.9).
        if settings.signedReports, hello.features.contains(.signedReports) {
            session.out.authLostSince = lostSince(of: hello.replicaID, holding: hello.context.maxCounter(of: hello.replicaID), state: state)
        }
        sessions[id] = session
        return [.wake(id)]
    }

    /// The peer's auth: verify it, then ask the roster. `lostSince`: its store was restored (§6.9).
    mutating func admit(_ id: SessionID, signature: [UInt8], lostSince: UInt64?, now: MonotonicInstant,
                        state: some ReplicaView) -> [Action] {
        guard let session = sessions[id], case .authenticating(var handshake) = session.state, let key = handshake.key else {
            return refuse(id, .malformed, "auth out of place", now: now)
        }
        let hello = handshake.hello
        handshake.lostSince = lostSince
        sessions[id]?.state = .authenticating(handshake)
        guard SessionAuth.verify(signature, key: key, peerNonce: hello.nonce ?? [], ownNonce: session.nonce,
                                 peer: hello.replicaID, group: settings.identity.groupID) else {
            return refuse(id, .notAdmitted, "authentication failed: the peer does not hold the device key it names", now: now)
        }
        // A device of a group upgraded from a shared secret enrolled itself, offline: a peer that
        // has not seen that entry yet learns it here (to a peer that has, it is harmless).
        if settings.identity.legacySecret != nil, let enrol = ownLegacyEnrol {
            sessions[id]?.out.join = [enrol]
        }
        switch roster.admission(of: key.deviceID, pendingJoin: settings.identity.pendingJoin) {
        case .refused(let reason, let text):
            return refuse(id, reason, text, now: now)
        case .candidate:
            sessions[id]?.state = .joining(handshake)
            let asked = CoreLog(.info, "an unknown device asks to join", sessionMetadata(session, ["peer.device": key.deviceID.shortForm]))
            // Our own legacy enrolment (set above) goes out now: the peer may not know us either.
            return sessions[id]?.out.join == nil ? [.log(asked)] : [.log(asked), .wake(id)]
        case .member:
            var actions = register(id, hello: hello, now: now, state: state)
            guard sessions[id]?.phase == .established else { return actions }
            if let join = settings.identity.pendingJoin {
                if key.deviceID == join.inviter || join.isRecovery {
                    sessions[id]?.out.join = [join.entry]
                    actions.append(.wake(id))
                }
            } else if sessions[id]?.out.join == nil, let proof = proofOfAdmission(for: hello, device: key.deviceID, state: state) {
                // Before any data (the round is planned in a later batch): the peer may not know us.
                sessions[id]?.out.join = proof.map(\.bytes)
                actions.append(.wake(id))
            }
            return actions
        }
    }

    /// This device's legacy enrolment entry, if it has one.
    var ownLegacyEnrol: [UInt8]? {
        let me = settings.identity.key.deviceID
        return roster.entries.values.first { $0.kind == .legacyEnrol && $0.signer == me }?.bytes
    }

    /// An unknown device presents the roster entries that admit it (PROTOCOL.md §6.4): a
    /// joiner's enrol or legacy enrol, or a member's proof of admission. Every entry is checked
    /// as if it came in a delta (``Roster/validate(incoming:)``) and the device must be active in
    /// the roster with them. If it is active without the enrols this node did not hold — by an
    /// admin's add (an admin signed it) or a legacy enrolment — that is all: the enrols then only
    /// date its admission, as they would in its catch-up once admitted. Otherwise every such
    /// enrol passes the live checks of a fresh join (its invite open at this node's wall clock,
    /// unused, unrevoked): an enrol's own timestamp could be backdated.
    mutating func join(_ id: SessionID, entries bytes: [[UInt8]], now: MonotonicInstant, wallClock: UInt64,
                       state: some ReplicaView) -> [Action] {
        // A joiner sends its entry once admitted by its inviter, a member its proof after admitting
        // us; a peer that knows the sender already ignores them (the machine's rules).
        guard let session = sessions[id], case .joining(let handshake) = session.state, let device = handshake.key?.deviceID else {
            return refuse(id, .malformed, "join out of place", now: now)
        }
        let hello = handshake.hello
        var entries: [RosterEntry] = []
        for raw in bytes {
            do {
                entries.append(try RosterEntry(bytes: raw))
            } catch {
                return refuse(id, .notAdmitted, "the join entry is malformed: \(error)", now: now)
            }
        }
        let admits: Bool = switch entries[0].payload {
        case .enrol, .legacyEnrol: entries[0].signer == device
        case .add(let key, _, _): key.deviceID == device
        default: false
        }
        guard admits, entries[0].groupID == settings.identity.groupID else {
            return refuse(id, .notAdmitted, "the join's first entry does not admit this device to this group "
                          + "(it must be the device's enrol or legacy enrol, or an add of its key; got \(entries[0].kind))", now: now)
        }
        if let future = entries.first(where: { $0.timestamp.physicalMilliseconds > wallClock &+ skewMilliseconds }) {
            return refuse(id, .notAdmitted, "the join entry \(future) is dated in the future", now: now)
        }
        let validation = roster.validate(incoming: entries)
        if let refusal = validation.refused.first {
            return refuse(id, .notAdmitted, "the proof of admission is refused: \(refusal)", now: now)
        }
        let after = validation.roster
        if case .refused(.deviceRemoved, let text) = after.admission(of: device, pendingJoin: nil) {
            return refuse(id, .deviceRemoved, text, now: now)
        }
        let enrols = validation.accepted.filter { $0.kind == .enrol }
        let withoutEnrols = enrols.isEmpty ? after : roster.adding(validation.accepted.filter { $0.kind != .enrol })
        let byAdmins = withoutEnrols.isActive(device)
        if !byAdmins {
            for case .enrol(let token, _) in enrols.map(\.payload) {
                if let refusal = withoutEnrols.joinRefusal(token: token, now: wallClock) { return refuse(id, .notAdmitted, refusal, now: now) }
            }
        }
        guard after.isActive(device) else {
            let reason = validation.noEffect.first?.reason ?? "the roster does not admit it"
            return refuse(id, .notAdmitted, reason, now: now)
        }
        // A store restored in place learns it here, before it writes the admission under the
        // replica ID it must leave (those writes could reuse dots and hide the restore).
        if let restored = refuseIfRestored(id, hello: hello, now: now, state: state) { return restored }
        let how = entries[0].kind == .legacyEnrol ? "legacy enrolment" : byAdmins ? "entries signed by admins" : "invite"
        return [.log(CoreLog(.info, "admitting a device", sessionMetadata(session, [
                    "peer.device": device.shortForm, "admitted.by": how, "entries": "\(validation.accepted.count)"]))),
                .admitDevice(id, device: device, entries: validation.accepted)]
    }

    /// The entries admitting the session's device are committed (and in `roster`): the session
    /// becomes a member's.
    mutating func joinerAdmitted(_ id: SessionID, roster: Roster, now: MonotonicInstant, state: some ReplicaView) -> [Action] {
        self.roster = roster
        let judged = judgeHeldReports()
        guard let session = sessions[id], case .joining(let handshake) = session.state else { return judged }
        let hello = handshake.hello
        return judged + register(id, hello: hello, now: now, state: state) + startCommitIfIdle(state: state, now: now)
    }

    /// The roster changed (a local or a peer's entry): sessions of devices no longer active end.
    mutating func updateRoster(_ roster: Roster, identity: LocalIdentity, now: MonotonicInstant) -> [Action] {
        self.roster = roster
        settings.identity = identity
        pruneProvisionalClaims()
        var actions = judgeHeldReports()
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

    /// Roster entries in a peer's delta must be well formed and authorised; every replica ID the
    /// delta names must be claimed by a device (``RecordMap/unclaimedReplica(roster:known:claimedElsewhere:)``);
    /// a removed device's writes beyond its cutoff are dropped (their dots stay known, so nobody
    /// offers them again).
    mutating func admitData(_ delta: RecordMap, from id: SessionID, now: MonotonicInstant, state: some ReplicaView) -> DataAdmission {
        if let violation = delta.limitViolation {
            return .refused(refuse(id, .malformed, "the delta breaks a limit: \(violation)", now: now))
        }
        // The roster as it will be once this delta is stored: a new device's claim on its replica
        // ID may travel in the same frame as its first writes.
        var withDelta = roster
        var claims: [ReplicaID] = []
        if delta.touchesRoster {
            let validation = roster.validate(delta: delta)
            if let refusal = validation.refused.first {
                let hostile = validation.hasMalformed
                return .refused(refuse(id, hostile ? .malformed : .other,
                                       hostile ? "roster entry refused: \(refusal)"
                                               : "roster entries arrived before the entries that authorise them (\(refusal)); try again",
                                       now: now))
            }
            withDelta = validation.roster
            for entry in validation.accepted {
                if case .writer(let replica) = entry.payload, withDelta.isClaimed(replica) { claims.append(replica) }
            }
        }
        if let replica = delta.unclaimedReplica(roster: withDelta, known: state.context,
                                                claimedElsewhere: { provisionalClaims[$0] != nil }) {
            return .refused(refuse(id, .unclaimedReplica,
                                   "the delta names replica \(replica.shortDescription), which no device of the group claims", now: now))
        }
        // Until this delta is committed (and the roster refreshed), later frames — of any session —
        // may already write under the replica IDs it claims.
        for replica in claims { provisionalClaims[replica] = id }
        guard let (stripped, count) = delta.strippingRefused(by: roster) else { return .admitted(delta) }
        if let session = sessions[id] {
            queuedLogs.append(CoreLog(.info, "dropped writes of a removed device", sessionMetadata(session, ["writes": "\(count)"])))
        }
        return .admitted(stripped)
    }

    /// Forgets provisional claims (``provisionalClaims``) that the roster now holds, or whose
    /// session ended with nothing of it left to commit (its frames are not stored then; a peer
    /// sends the claim again with its writes).
    mutating func pruneProvisionalClaims() {
        guard !provisionalClaims.isEmpty else { return }
        var pending = Set(queued.map(\.session))
        if let inFlight { pending.formUnion(inFlight.parts.map(\.session)) }
        provisionalClaims = provisionalClaims.filter { replica, session in
            !roster.isClaimed(replica) && (sessions[session] != nil || pending.contains(session))
        }
    }

    func origin(of session: PeerSession) -> String {
        "peer:" + (session.peer?.replicaID.shortDescription ?? session.origin.address)
    }

    /// Admits an established session under the duplicate rule and queues its catch-up.
    mutating func register(_ id: SessionID, hello: Hello, now: MonotonicInstant, state: some ReplicaView) -> [Action] {
        var actions: [Action] = []
        if let restored = refuseIfRestored(id, hello: hello, now: now, state: state) { return restored }
        if established[hello.replicaID] == nil, established.count >= settings.limits.sessions {
            return refuse(id, .overloaded, "this node has \(established.count) sessions, its limit", now: now)
        }
        if let existingID = established[hello.replicaID], let existing = sessions[existingID] {
            // Of two sessions between one pair, the one dialed by the lower replica ID survives
            // (if both were dialed by the same side, the newer one); both ends decide alike.
            let newDialer = sessions[id]?.origin.initiator == true ? settings.localReplica : hello.replicaID
            let oldDialer = existing.origin.initiator ? settings.localReplica : hello.replicaID
            let keepNew = newDialer == oldDialer ? true : newDialer < oldDialer
            let loser = keepNew ? existingID : id
            sessions[loser]?.close(with: .goodbye(.duplicateConnection, "another connection to this peer is kept"), reason: .duplicate,
                                   now: now)
            actions.append(.wake(loser))
            if !keepNew { return actions }
            established[hello.replicaID] = nil
        }
        guard var session = sessions[id], let handshake = session.handshake else { return actions }
        session.state = .established(handshake, PeerSession.Link(maxFrame: Int(min(hello.maxFrameBytes, UInt64(Int32.max))),
                                                                  delivered: hello.context))
        // A peer whose context lacks part of the stable context this replica compacted with is
        // from the past (a store put back from a backup; a new device): it gets every record held
        // here, marked complete, so it can delete what the group purged meanwhile (§6.5).
        let purged = state.records.compactedThrough
        let complete = settings.signedReports && hello.features.contains(.signedReports) && !purged.isEmpty
            && !hello.context.includes(purged)
        let extract = settings.transfer == .fullState || complete ? state.records : state.delta(missingFrom: hello.context)
        session.out.push(catchUp: extract, stable: complete ? purged : nil)
        // Reports first: a peer put back from a backup learns from them before the round (§19).
        if hello.features.contains(.signedReports), settings.signedReports { session.out.gossipDue = true }
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

    /// The peer has writes in our name we do not: this store was restored from an older copy (or
    /// copied, and the copy wrote). Writing on under this ID would reuse dots: refuse, and let the
    /// engine begin a new incarnation. Nil if not.
    mutating func refuseIfRestored(_ id: SessionID, hello: Hello, now: MonotonicInstant, state: some ReplicaView) -> [Action]? {
        let issued = state.context.maxCounter(of: settings.localReplica)
        let known = hello.context.maxCounter(of: settings.localReplica)
        guard known > issued else { return nil }
        guard let session = sessions[id] else { return [] }
        let info = PeerInfo(replicaID: hello.replicaID, name: hello.name, address: session.origin.address,
                            dialed: session.origin.initiator)
        return refuse(id, .replicaRestored, "the peer knows \(known) writes by this replica, this store has \(issued)", now: now)
            + [.event(.restoredStoreDetected(info, replica: settings.localReplica, peerKnows: known, localHas: issued,
                                             lostSince: session.handshake?.lostSince))]
    }

    /// The replicas with an established session, sorted.
    var neighborList: [ReplicaID] { established.keys.sorted() }

    /// Tells every peer whom this node is connected to now, so they forward only what it lacks.
    mutating func announceNeighbors() -> [Action] {
        var actions: [Action] = []
        for id in established.values.sorted() {
            sessions[id]?.out.ackDue = true
            actions.append(.wake(id))
        }
        return actions
    }
}
