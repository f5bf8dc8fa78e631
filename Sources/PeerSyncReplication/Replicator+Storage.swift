import Dispatch
import Logging
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncWire

/// Work the replicator hands to storage besides committing rounds: a joiner's admission, and
/// the compaction reports (others' checked ones, and this node's own, stored before sent).
extension Replicator {
    /// Writes the entries that admit a device to the roster, with this admin's confirmation if
    /// it owes one (a local change, shipped to every peer), then lets its session in — before
    /// the session's next frame is read, so its data never arrives before its admission.
    func admit(_ id: SessionID, _ device: DeviceID, _ entries: [RosterEntry]) {
        do {
            let (identity, skew) = (self.identity, maxSkewMilliseconds)
            // A local commit: it reaches every peer through the commit feed.
            _ = try storage.commitLocal { state in
                try state.storeAdmission(entries, of: device, signer: identity, maxSkewMilliseconds: skew)
            }
            let state = storage.snapshot()
            perform(core.joinerAdmitted(id, roster: state.roster(of: identity.groupID), now: .now, state: state))
            refreshRoster()
        } catch {
            perform(core.refuse(id, .other, "the inviter's storage failed", now: .now))
            logger.error("cannot store a joiner's roster entry", metadata: ["error": "\(error)"])
        }
    }

    /// Records checked reports in storage on the commit queue (a small write, never on the
    /// actor; in order with commits, so a store that learns it was put back from a backup
    /// recovers before a later round is stored); if they grew what this node knows, sessions
    /// send them on with their next digest round and the engine may compact.
    func recordSeen(_ reports: [SeenReport]) {
        let storage = self.storage
        let logger = self.logger
        commitQueue.async { [weak self] in
            let recorded: RecordedReports
            do {
                recorded = try storage.recordSeen(reports)
            } catch {
                logger.debug("cannot store compaction reports", metadata: ["error": "\(error)"])
                return
            }
            guard recorded.grew || !recorded.fromLostFuture.isEmpty else { return }
            Task { await self?.seenRecorded(recorded) }
        }
    }

    func seenRecorded(_ recorded: RecordedReports) {
        // (A copy of a store meets reports its twin signed under their common old ID: nothing of
        // its own to move, nothing to say.)
        if let previous = recorded.leftIncarnation ?? recorded.fromLostFuture.first?.replica,
           recorded.leftIncarnation != nil || recorded.movedEvents > 0 {
            // This store was put back from a backup and has recovered (storage moved its writes
            // since the restore, and continues under a new replica ID if its current one was the
            // lost future's): sessions announced the old ID, so all of them end; the owner
            // restarts sync.
            if recorded.leftIncarnation != nil { perform(core.shutdown(now: .now)) }
            emit(.restoreRecovered(previous: previous, newIncarnation: recorded.leftIncarnation != nil, moved: recorded.movedEvents))
        }
        if recorded.grew {
            perform(core.gossipChanged(now: .now))
            emit(.gossipReceived)
        }
    }

    /// Stores this node's newly signed report (durably: before it is sent), then lets sessions
    /// gossip it.
    func saveOwnReport(_ report: SeenReport) {
        let storage = self.storage
        let logger = self.logger
        commitQueue.async { [weak self] in
            var saved: SeenReport? = report
            do {
                try storage.saveOwnReport(report)
            } catch {
                logger.debug("cannot store this node's compaction report", metadata: ["error": "\(error)"])
                saved = nil
            }
            Task { await self?.ownReportSaved(saved) }
        }
    }

    func ownReportSaved(_ report: SeenReport?) {
        perform(core.ownReportSaved(report, now: .now))
    }
}
