import Dispatch
import Logging
import Crypto
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncWire
import Synchronization

/// The roster as the replicator follows it: what a roster change means for sessions and this
/// device, and the confirmations an admin owes.
extension Replicator {
    /// Re-reads the roster from the local state, ends sessions of devices no longer admitted,
    /// and notices this device's own join or removal.
    func refreshRoster() {
        let state = storage.snapshot()
        let roster = state.roster(of: identity.groupID)
        let me = identity.key.deviceID
        if identity.pendingJoin != nil, roster.isActive(me) {
            identity.pendingJoin = nil
            logger.info("joined the group", metadata: ["device.id": "\(me.shortForm)"])
            emit(.joined(roster))
        }
        let removedSelf = roster.isRemoved(me)
        // Entries that do not count are kept (the roster is add-only) and said once each.
        for ineffective in roster.ineffective where !reportedIneffective.contains(ineffective.entry.id) {
            reportedIneffective.insert(ineffective.entry.id)
            if roster.isConfirmation(ineffective.entry) { continue }  // no effect by design
            logger.warning("roster entry has no effect", metadata: [
                "entry.id": "\(ineffective.entry.id.shortDescription)", "entry.kind": "\(ineffective.entry.kind)",
                "entry.signer": "\(ineffective.entry.signer.shortForm)", "reason": "\(ineffective.reason)",
            ])
        }
        perform(core.updateRoster(roster, identity: identity, now: .now))
        emit(.rosterChanged(roster, removedSelf: removedSelf))
        confirmAdmissions()
    }

    var maxSkewMilliseconds: UInt64 { UInt64(max(0, configuration.timing.maxClockSkew.wholeMilliseconds)) }

    /// An admin signs the confirmations it owes (``Roster/confirmationsDue(by:heardFrom:)``):
    /// devices it admitted by an enrol before confirmations existed get an add of their key, so
    /// they can prove their admission to a peer that lacks the enrol (a restored admin).
    func confirmAdmissions() {
        guard !confirming, identity.pendingJoin == nil,
              !core.roster.confirmationsDue(by: identity.key.deviceID, heardFrom: roundsHeardFrom).isEmpty else { return }
        confirming = true
        defer { confirming = false }
        let (identity, heard, skew) = (self.identity, roundsHeardFrom, maxSkewMilliseconds)
        do {
            guard let delta = try storage.commitLocal({ state in
                try state.confirmAdmissions(signer: identity, heardFrom: heard, maxSkewMilliseconds: skew)
            }) else { return }
            logger.info("confirmed admissions by invite with admin-signed entries",
                        metadata: ["entries": "\(delta.records(in: RosterEntry.collection).count)"])
            refreshRoster()  // the entries reach peers through the commit feed
        } catch {
            logger.warning("cannot store the confirmation of an admission", metadata: ["error": "\(error)"])
        }
    }
}
