@_spi(Engine) import PeerSyncCRDT
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
    /// A `seen` message from the peer of established session `id`. A report another device's key does not
    /// sign, or for another group, or that a device makes for a replica another device claims
    /// closes the session (reason 15) and nothing of the message is kept; reports of devices or
    /// claims this roster does not have yet, of removed devices, and older ones, are left out.
    mutating func receiveSeen(_ id: SessionID, reports: [SeenReport], now: MonotonicInstant) -> [Action] {
        guard let session = sessions[id] else { return [] }
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
                heldReports.hold(report, unlessOlderThan: reportTimes[report.replica])
            case .removedDevice:
                break
            }
        }
        var actions: [Action] = []
        if !skipped.isEmpty {
            actions.append(.log(CoreLog(.debug, "compaction reports held until the roster knows their device", sessionMetadata(session, ["reason": skipped.joined(separator: "; ")]))))
        }
        for report in valid where report.time > reportTimes[report.replica] ?? 0 { reportTimes[report.replica] = report.time }
        // The peer has what it sent: never sent back to it.
        sessions[id]?.withLink { link in
            for report in reports where report.time > link.reportsSent[report.replica] ?? 0 { link.reportsSent[report.replica] = report.time }
        }
        if !valid.isEmpty { actions.append(.recordSeen(valid)) }
        return actions
    }

    /// The roster changed: held reports it now lets us judge count, or are dropped (forged, or
    /// by a removed device); the rest wait on.
    mutating func judgeHeldReports() -> [Action] {
        guard !heldReports.isEmpty else { return [] }
        var valid: [SeenReport] = []
        var actions: [Action] = []
        for report in heldReports.all {
            let verdict = report.verdict(in: roster)
            if case .notYetKnown = verdict { continue }
            heldReports.remove(report.replica)
            switch verdict {
            case .valid:
                if report.time > reportTimes[report.replica] ?? 0 { reportTimes[report.replica] = report.time }
                valid.append(report)
            case .forged(let why):
                // The session that brought it may be gone: the report is dropped and said.
                actions.append(.log(CoreLog(.warning, "a held compaction report is refused", ["reason": "\(why)"])))
            case .removedDevice, .notYetKnown:
                break
            }
        }
        if !valid.isEmpty { actions.append(.recordSeen(valid)) }
        return actions
    }

    /// The local gossip grew (storage recorded something new): every established session that
    /// speaks it sends it with its next digest round.
    mutating func gossipChanged(now: MonotonicInstant) -> [Action] {
        for id in established.values where sessions[id]?.peer?.features.contains(.signedReports) == true {
            sessions[id]?.withLink { $0.gossipPending = true }
        }
        return []
    }

    /// A compaction step purged deleted records from the local state (PROTOCOL §19.4; the shell
    /// calls this after a step that purged something). A purge leaves the digest as it was (it
    /// counts visible records only) but not the records held: every established session sends a
    /// digest with the next digest round — its `records` the new count — so each peer checks
    /// convergence against the compacted state at once, and with it, on a gossip round, the
    /// reports that peer was not sent yet. Nothing else: no catch-up round, no repair.
    mutating func compacted(now: MonotonicInstant) -> [Action] {
        for id in established.values {
            let signedReports = sessions[id]?.peer?.features.contains(.signedReports) == true
            sessions[id]?.withLink { link in
                link.changedSinceDigest = true
                if signedReports { link.gossipPending = true }
            }
        }
        return []
    }

    /// Signs a new report of this replica's context if it grew since the last one and a gossip
    /// round came since (at most one signature per round); the shell stores it, then calls
    /// ``ownReportSaved(_:now:)``. Its time is the wall clock, never below the last report's + 1.
    mutating func refreshOwnReport(state: some ReplicaView, wallClock: UInt64) -> [Action] {
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
    /// could not be): it goes out now — it was signed in a gossip round, at most one per round,
    /// and waiting for the next round put one quiet period more on every compaction.
    mutating func ownReportSaved(_ report: SeenReport?, now: MonotonicInstant) -> [Action] {
        ownReportPending = false
        guard let report else { return [] }
        ownReport = report
        var actions: [Action] = []
        for id in established.values.sorted() where sessions[id]?.peer?.features.contains(.signedReports) == true {
            sessions[id]?.out.gossipDue = true
            actions.append(.wake(id))
        }
        return actions
    }

    /// The newest time this node knows of writes or reports by `replica` beyond `counter` (what
    /// the peer's hello says it holds of its own writes): sent in the auth of a peer whose store
    /// was restored, so it can tell its writes since the restore from older ones (PROTOCOL §6.9).
    func lostSince(of replica: ReplicaID, holding counter: UInt64, state: some ReplicaView) -> UInt64? {
        guard state.context.maxCounter(of: replica) > counter else { return nil }
        let newest = [reportTimes[replica], state.records.newestWrite(by: replica, above: counter)].compactMap { $0 }.max()
        return newest
    }
}

/// Reports the roster could not judge yet when they arrived (their device or its claim on the
/// replica was on its way): the newest per replica, at most ``limit`` replicas and
/// ``byteLimit`` bytes, so that a member sending reports of devices nobody knows costs bounded
/// memory. When full, a new replica's report is dropped (its signer's next report brings it).
struct HeldReports {
    static let limit = 256
    static let byteLimit = 4 << 20
    private var byReplica: [ReplicaID: SeenReport] = [:]
    private var bytes = 0

    var isEmpty: Bool { byReplica.isEmpty }
    /// In replica order (deterministic).
    var all: [SeenReport] { byReplica.keys.sorted().map { byReplica[$0]! } }

    mutating func hold(_ report: SeenReport, unlessOlderThan known: UInt64?) {
        guard report.time > known ?? 0 else { return }
        let size = report.bytes.count
        if let held = byReplica[report.replica] {
            guard report.time > held.time else { return }
            bytes -= held.bytes.count
        } else if byReplica.count >= Self.limit || bytes + size > Self.byteLimit {
            return
        }
        byReplica[report.replica] = report
        bytes += size
    }

    mutating func remove(_ replica: ReplicaID) {
        if let held = byReplica.removeValue(forKey: replica) { bytes -= held.bytes.count }
    }
}
