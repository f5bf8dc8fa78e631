import Foundation
import Logging
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncReplication
import PeerSyncNetwork
import PeerSyncStore

// The roster as this replica sees it, and what admins (and each device of itself) change in it.
extension Replica {
    /// The group's roster as this replica has it.
    public nonisolated func roster() -> Roster { state.roster(of: groupID) }

    /// This device's role, or nil if it is not (or no longer, or not yet) an active member.
    public nonisolated var role: DeviceRole? { roster().role(of: deviceID) }

    /// What this device knows of its own removal: the signed removal in its roster, or else what
    /// a peer that refused it as removed said while sync ran (nil: nothing).
    public var removal: RemovalNotice? { RemovalNotice(roster: roster(), device: deviceID) ?? removalNoted }

    /// Notes that this device was removed, and says so in the status from now on. A removal in
    /// the roster (signed) is not replaced by a peer's word.
    func noteRemoval(_ notice: RemovalNotice) {
        if case .roster? = removalNoted?.source, notice.source != .roster { return }
        if removalNoted == nil { logger.warning("this device was removed from the group", metadata: ["removal": "\(notice)"]) }
        removalNoted = notice
        setStatus(status)
    }

    /// Notes this device's removal if `roster` holds it.
    func noteRemoval(in roster: Roster) {
        if let notice = RemovalNotice(roster: roster, device: deviceID) { noteRemoval(notice) }
    }

    /// Resolves a device ID, its human form, or a unique prefix of it.
    public nonisolated func device(matching text: String) throws(DeviceAdministrationError) -> Roster.Device {
        let roster = self.roster()
        let wanted = text.uppercased().filter { $0 != "-" && !$0.isWhitespace }
        let matches = roster.devices.values.filter { $0.id.humanForm.filter { $0 != "-" }.hasPrefix(wanted) }
        guard !wanted.isEmpty, let first = matches.first else { throw .unknownDevice(text) }
        guard matches.count == 1 else { throw .ambiguousDevice(text, matches: matches.map(\.id.shortForm).sorted()) }
        return first
    }

    /// Writes a roster entry signed by this device, after checking it has the right.
    func writeRosterEntry(adminOnly: Bool, _ build: (Roster, RosterEntryContext, ReplicaState) throws -> RosterEntry) async throws {
        let key = deviceKey
        let group = groupID
        try await commit { state in
            let roster = state.roster(of: group)
            guard !roster.isRemoved(key.deviceID) else { throw DeviceAdministrationError.removed }
            if adminOnly, roster.role(of: key.deviceID) != .admin {
                throw DeviceAdministrationError.notAdmin(role: roster.role(of: key.deviceID)?.description ?? "device still joining")
            }
            let entry = try build(roster, roster.context(for: key.deviceID, at: state.nextTimestamp()), state)
            return state.write(entry.fields, to: entry.recordKey)
        }
    }

    /// An invite code that lets one new device join once, before `expires` from now, with `role`.
    /// Admins only.
    public func invite(role: DeviceRole = .member, expires: Duration = .seconds(24 * 3600)) async throws(ReplicaError) -> InviteCode {
        try await ReplicaError.wrapping {
            let token = InviteToken.generate()
            let expiresAt = HybridLogicalClock.wallClock() + UInt64(max(0, expires.wholeMilliseconds))
            try await writeRosterEntry(adminOnly: true) { _, context, _ in
                try RosterEntry.make(.invite(token.hash, role: role, expiresAt: expiresAt), context: context, signer: deviceKey)
            }
            return InviteCode(groupID: groupID, inviter: deviceID, token: token)
        }
    }

    /// Revokes an unused invite (by its code). Admins only.
    public func revokeInvite(_ code: InviteCode) async throws(ReplicaError) {
        try await ReplicaError.wrapping {
            if let refusal = roster().joinRefusal(token: code.token, now: HybridLogicalClock.wallClock()) {
                throw DeviceAdministrationError.inviteNotOpen(refusal)
            }
            try await writeRosterEntry(adminOnly: true) { _, context, _ in
                try RosterEntry.make(.revokeInvite(code.token.hash), context: context, signer: deviceKey)
            }
        }
    }

    /// Removes a device from the group, for good: every node that learns of it closes its
    /// sessions with that device, refuses new ones, and drops what it writes from now on. What it
    /// wrote before (as far as this device has seen) stays. Admins only.
    public func removeDevice(_ device: DeviceID) async throws(ReplicaError) {
        try await ReplicaError.wrapping {
            let roster = self.roster()
            guard roster.devices[device] != nil else { throw DeviceAdministrationError.unknownDevice(device.shortForm) }
            guard roster.isActive(device) else { throw DeviceAdministrationError.alreadyRemoved(device.shortForm) }
            try await writeRosterEntry(adminOnly: true) { roster, context, state in
                // The cutoff: what this device has seen of the removed one's writes (the transaction's
                // state, never `self.state`, whose lock the transaction holds).
                try RosterEntry.make(roster.removal(of: device, seen: state.context), context: context, signer: deviceKey)
            }
            // A group with data keys (relays) starts a new epoch: the removed device gets no key
            // to what is written from now on (PROTOCOL §20.2).
            if !Self.envelopes(in: state).isEmpty { try await rotateDataKey() }
        }
    }

    /// Makes `device` an admin, or a member again (admins only). An admin's phone is the one
    /// most likely to be lost: a group with a second admin (or a recovery code,
    /// ``makeRecoveryCode()``) can still add and remove devices then. Demoting the last admin is
    /// refused (``DeviceAdministrationError/lastAdmin(_:)``).
    public func setRole(_ device: DeviceID, to role: DeviceRole) async throws(ReplicaError) {
        try await ReplicaError.wrapping {
            let roster = self.roster()
            guard let entry = roster.devices[device] else { throw DeviceAdministrationError.unknownDevice(device.shortForm) }
            guard entry.isActive else { throw DeviceAdministrationError.alreadyRemoved(device.shortForm) }
            guard entry.role != role else { return }
            if entry.role == .admin, roster.deviceAdmins.count == 1 { throw DeviceAdministrationError.lastAdmin(device.shortForm) }
            try await writeRosterEntry(adminOnly: true) { _, context, _ in
                try RosterEntry.make(.add(device: entry.publicKey, name: entry.name, role: role), context: context, signer: deviceKey)
            }
        }
    }

    /// One line to show when the group depends on a single admin device (nil otherwise): if that
    /// device is lost, nobody can add or remove devices. Also in ``SyncHealth/warnings`` and
    /// `peersync status`.
    public nonisolated var adminWarning: String? {
        let roster = self.roster()
        let admins = roster.deviceAdmins
        guard admins.count == 1, let admin = admins.first else { return nil }
        let recovery = roster.recoveryKeys.isEmpty ? "" : " (a recovery code can still enrol a new admin device)"
        return "\(admin.name) is the only admin device of this group\(recovery): if it is lost, nobody can add or remove devices; make a second device an admin (setRole / `peersync devices promote`)"
    }

    /// Renames a device (this one, or any as an admin).
    public func renameDevice(_ device: DeviceID, to name: String) async throws(ReplicaError) {
        try await ReplicaError.wrapping {
            guard roster().devices[device] != nil else { throw DeviceAdministrationError.unknownDevice(device.shortForm) }
            try await writeRosterEntry(adminOnly: device != deviceID) { _, context, _ in
                try RosterEntry.make(.rename(device: device, name: name), context: context, signer: deviceKey)
            }
        }
    }

    /// Closes an upgraded group to its old shared secret: legacy enrolments made after this no
    /// longer count. Do it once every device has upgraded. Admins only.
    public func closeLegacyEnrolment() async throws(ReplicaError) {
        try await ReplicaError.wrapping {
            guard roster().entries.values.contains(where: { $0.kind == .legacyGenesis }), !roster().isLegacyEnrolmentClosed else {
                throw DeviceAdministrationError.noLegacyEnrolment
            }
            try await writeRosterEntry(adminOnly: true) { roster, context, _ in
                try RosterEntry.make(roster.closingLegacyEnrolment(), context: context, signer: deviceKey)
            }
        }
    }
}
