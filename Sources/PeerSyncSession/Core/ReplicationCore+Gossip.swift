import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncWire

/// The compaction gossip (docs/PROTOCOL.md §19): each device signs what it has seen, and every
/// node passes the reports on unchanged, so each can tell which deletions are stable without
/// taking anyone's word for it. Received reports are checked against the roster here and
/// become ``ReplicationCore/Action/recordSeen(_:)``; the shell stores them and, if that grew
/// what this node knows, calls ``ReplicationCore/gossipChanged(now:)`` — every session then
/// sends them on with its next digest round. Its own report is signed when its context grew
/// since the last one, stored, and then gossiped (``refreshOwnReport(state:wallClock:)``).
extension ReplicationCore {
    /// A `seen` message from the peer of session `id`. A report another device's key does not
    /// sign, or for another group, or that a device makes for a replica another device claims
    /// closes the session (reason 15) and nothing of the message is kept; reports of devices or
    /// claims this roster does not have yet, of removed devices, and older ones, are left out.
    mutating func receiveSeen(_ id: SessionID, body: [UInt8], now: MonotonicInstant) -> [Action] {
        guard let session = sessions[id], session.phase == .established else {
            return refuse(id, .notAdmitted, "seen before admission", now: now)
        }
        let reports: [SeenReport]
        do throws(WireError) {
            reports = try SeenMessage.decode(body: body)
        } catch {
            return refuse(id, .malformed, "\(error)", now: now)
        }
        var valid: [SeenReport] = []
        var skipped: [String] = []
        for report in reports {
            switch report.verdict(in: roster) {
            case .valid:
                valid.append(report)
            case .forged(let why):
                return refuse(id, .forgedReport, "a compaction report is refused: \(why)", now: now)
            case .notYetKnown(let why):
                skipped.append(why)
            case .removedDevice:
                break
            }
        }
        var actions: [Action] = []
        if !skipped.isEmpty {
            actions.append(.log(CoreLog(.debug, "compaction reports left out", sessionMetadata(session, ["reason": skipped.joined(separator: "; ")]))))
        }
        for report in valid where report.time > reportTimes[report.replica] ?? 0 { reportTimes[report.replica] = report.time }
        // The peer has what it sent: never sent back to it.
        for report in reports where report.time > sessions[id]!.reportsSent[report.replica] ?? 0 {
            sessions[id]!.reportsSent[report.replica] = report.time
        }
        if !valid.isEmpty { actions.append(.recordSeen(valid)) }
        return actions
    }

    /// The local gossip grew (storage recorded something new): every established session that
    /// speaks it sends it with its next digest round.
    mutating func gossipChanged(now: MonotonicInstant) -> [Action] {
        for id in established.values where sessions[id]?.peer?.features.contains(.signedReports) == true {
            sessions[id]!.gossipPending = true
        }
        return []
    }

    /// Signs a new report of this replica's context if it grew since the last one and a gossip
    /// round came since (at most one signature per round); the shell stores it, then calls
    /// ``ownReportSaved(_:now:)``. Its time is the wall clock, never below the last report's + 1.
    mutating func refreshOwnReport(state: ReplicaState, wallClock: UInt64) -> [Action] {
        guard settings.signedReports, !ownReportPending, let round = lastGossipRound, round != ownReportRound,
              ownReport?.context != state.context, !state.context.isEmpty else { return [] }
        ownReportRound = round
        ownReportPending = true
        let time = max(wallClock, (ownReport?.time ?? 0) + 1)
        let report = SeenReport.signed(by: settings.identity.key, group: settings.identity.groupID, replica: settings.localReplica,
                                       time: time, context: state.context)
        return [.saveOwnReport(report)]
    }

    /// A report signed by ``refreshOwnReport(state:wallClock:)`` is stored (or, `report` nil,
    /// could not be): it goes out with the next gossip round.
    mutating func ownReportSaved(_ report: SeenReport?, now: MonotonicInstant) -> [Action] {
        ownReportPending = false
        guard let report else { return [] }
        ownReport = report
        return gossipChanged(now: now)
    }

    /// The newest time this node knows of writes or reports by `replica` beyond `counter` (what
    /// the peer's hello says it holds of its own writes): sent in the auth of a peer whose store
    /// was restored, so it can tell its writes since the restore from older ones (PROTOCOL §6.9).
    func lostSince(of replica: ReplicaID, holding counter: UInt64, state: ReplicaState) -> UInt64? {
        guard state.context.maxCounter(of: replica) > counter else { return nil }
        let newest = [reportTimes[replica], state.records.newestWrite(by: replica, above: counter)].compactMap { $0 }.max()
        return newest
    }
}
