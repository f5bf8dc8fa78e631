import PeerSyncIdentity

extension ReplicationCore {
    /// Whether a refused session is worth a warning (a person can act on it) or debug: a peer
    /// that is simply not there, or the same refusal by or of the same peer said before (a spent
    /// invite, a removed device, asking again after its backoff). The peer is its device once its
    /// hello arrived, else the address this node dialed.
    mutating func refusalLevel(_ reason: SessionEndReason, of session: PeerSession) -> CoreLog.Level {
        switch reason {
        case .unreachable, .connectionLost, .localShutdown, .duplicate: return .debug
        default: break
        }
        guard let peer = session.peerKey?.deviceID.shortForm ?? (session.origin.initiator ? session.origin.address : nil) else {
            return .warning
        }
        if loggedRefusals.count >= 1_024 { loggedRefusals = [] }
        return loggedRefusals.insert("\(peer) \(reason)").inserted ? .warning : .debug
    }

    /// An established session's end is said at info, but the peer refusing this device at
    /// admission after all (a joiner's spent invite, this device removed) as a refusal is.
    mutating func disconnectLevel(_ reason: SessionEndReason, of session: PeerSession) -> CoreLog.Level {
        switch reason {
        case .peerClosed(.notAdmitted, _), .peerClosed(.deviceRemoved, _), .peerClosed(.protocolVersion, _):
            refusalLevel(reason, of: session)
        default:
            .info
        }
    }
}
