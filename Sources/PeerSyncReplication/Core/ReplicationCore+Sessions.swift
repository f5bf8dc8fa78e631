@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncWire

/// Sessions opening and ending: a connected transport gets a session and this side's hello;
/// a transport that ended, or a local close or shutdown, ends it.
extension ReplicationCore {
    /// A transport is connected: creates the session and queues this side's hello.
    /// `nonce`: 16 random bytes the peer will sign.
    mutating func open(_ origin: SessionOrigin, now: MonotonicInstant, wallClock: UInt64, state: some ReplicaView, nonce: [UInt8])
        -> (SessionID, [Action])
    {
        let id = SessionID(nextSessionID)
        nextSessionID += 1
        let hello = Hello(replicaID: settings.localReplica, name: settings.name, wallClockMilliseconds: wallClock,
                          context: state.context, maxFrameBytes: UInt64(settings.limits.maxFrameBytes), digest: state.digest,
                          groupID: settings.identity.groupID.bytes, deviceKey: settings.identity.key.publicKey.x963, nonce: nonce,
                          features: localFeatures)
        var session = PeerSession(
            id: id, origin: origin,
            machine: SessionStateMachine(localReplica: settings.localReplica, maxClockSkewMilliseconds: skewMilliseconds,
                                         readsAttachments: settings.attachments, readsSeen: settings.signedReports),
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
        pruneProvisionalClaims()
        let why = session.endReason ?? reason
        if let peer = session.peer, established[peer.replicaID] == id {
            established[peer.replicaID] = nil
            actions += announceNeighbors()
        }
        if session.announced {
            // A session replaced by a duplicate leaves its peer connected: no disconnect then.
            if let info = session.info, established[info.replicaID] == nil {
                actions.append(.log(CoreLog(disconnectLevel(why, of: session), "peer disconnected",
                                            ["peer.id": info.replicaID.shortDescription, "reason": "\(why)"])))
                actions.append(.event(.peerDisconnected(info, reason: why)))
            }
        } else if why != .duplicate {
            actions.append(.log(CoreLog(refusalLevel(why, of: session), "session refused",
                                        ["peer.address": session.origin.address, "reason": "\(why)"])))
            actions.append(.event(.sessionRefused(address: session.origin.address, reason: why)))
        }
        return actions
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
}
