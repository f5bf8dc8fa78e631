@_spi(Engine) import PeerSyncCRDT

/// One evaluation round: the state while applying entries in order.
struct Evaluation {
    let groupID: GroupID
    var groupName: String?
    var genesisSeen = false
    var devices: [DeviceID: Roster.Device] = [:]
    var banned: [DeviceID: Roster.Removal] = [:]
    var writers: [ReplicaID: DeviceID] = [:]
    var invites: [InviteHash: Roster.Invite] = [:]
    var legacyClosedBy: RosterEntryID?
    var legacyClosedAt: HLCTimestamp?
    var legacyCloser: DeviceID?
    var countedLegacyEnrols: Set<RosterEntryID> = []
    var ineffective: [Roster.IneffectiveEntry] = []
    var effective: Set<RosterEntryID> = []

    init(groupID: GroupID) { self.groupID = groupID }

    mutating func apply(_ entry: RosterEntry, voided: [RosterEntryID: String]) {
        let reason: String? = if let void = voided[entry.id] { void } else { effect(of: entry) }
        if let reason {
            ineffective.append(Roster.IneffectiveEntry(entry: entry, reason: reason))
        } else {
            effective.insert(entry.id)
        }
    }

    private var activeAdminCount: Int { devices.values.count { $0.isActive && $0.role == .admin } }

    /// Why `device` is not an active member, or nil if it is.
    private func notActive(_ device: DeviceID) -> String? {
        if let removal = devices[device]?.removal ?? banned[device] {
            return "\(device.shortForm) was removed by \(removal.by.shortForm) at \(removal.at)"
        }
        return devices[device] == nil ? "\(device.shortForm) is not a member" : nil
    }

    /// Why `device` is not an active admin (or recovery key: it signs with an admin's rights),
    /// or nil if it is.
    private func notAdmin(_ device: DeviceID) -> String? {
        if let reason = notActive(device) { return reason }
        return devices[device]!.role.signsAsAdmin ? nil : "\(device.shortForm) is not an admin"
    }

    /// Why a new device with `key` may not join, or nil.
    private func cannotJoin(_ key: DevicePublicKey) -> String? {
        let id = key.deviceID
        if GroupID(legacyKey: key) == groupID { return "the group's legacy key cannot be a device" }
        if let removal = devices[id]?.removal ?? banned[id] {
            return "\(id.shortForm) was removed by \(removal.by.shortForm) at \(removal.at); a removed device cannot join again"
        }
        if devices[id] != nil { return "\(id.shortForm) is already a member" }
        return nil
    }

    /// Applies `entry` if it counts; otherwise returns why not.
    private mutating func effect(of entry: RosterEntry) -> String? {
        let signer = entry.signer
        switch entry.payload {
        case let .genesis(groupName, creatorName):
            guard !genesisSeen else { return "the group already has a genesis" }
            genesisSeen = true
            self.groupName = groupName
            devices[signer] = Roster.Device(
                id: signer, publicKey: entry.signerKey, name: creatorName, role: .admin, origin: .createdGroup,
                addedBy: nil, addedAt: entry.timestamp, addedByEntry: entry.id, removal: nil)

        case let .legacyGenesis(name):
            guard groupName == nil else { return "the group is already named" }
            groupName = name

        case let .add(key, name, role):
            if let reason = notAdmin(signer) { return reason }
            let id = key.deviceID
            if var device = devices[id], device.isActive {
                guard device.role != role || device.name != name else {
                    return "\(id.shortForm) is already a member with role \(role) and that name"
                }
                if device.role == .admin, role == .member, activeAdminCount == 1 {
                    return "demoting \(id.shortForm) would leave the group without an admin"
                }
                device.role = role
                device.name = name
                devices[id] = device
                return nil
            }
            if let reason = cannotJoin(key) { return reason }
            devices[id] = Roster.Device(
                id: id, publicKey: key, name: name, role: role, origin: .added, addedBy: signer,
                addedAt: entry.timestamp, addedByEntry: entry.id, removal: nil)

        case let .remove(target, cutoff, heads):
            if let reason = notAdmin(signer) { return reason }
            if var device = devices[target] {
                if var removal = device.removal {
                    // A second removal: it can only widen what still counts.
                    removal.dataCutoff.merge(cutoff, uniquingKeysWith: max)
                    removal.rosterHeads.formUnion(heads)
                    device.removal = removal
                    devices[target] = device
                    return nil
                }
                if device.role == .admin, activeAdminCount == 1 {
                    return "removing \(target.shortForm) would leave the group without an admin"
                }
                device.removal = Roster.Removal(
                    by: signer, at: entry.timestamp, entry: entry.id, dataCutoff: cutoff, rosterHeads: Set(heads))
                devices[target] = device
            } else if var removal = banned[target] {
                removal.dataCutoff.merge(cutoff, uniquingKeysWith: max)
                removal.rosterHeads.formUnion(heads)
                banned[target] = removal
            } else {
                banned[target] = Roster.Removal(
                    by: signer, at: entry.timestamp, entry: entry.id, dataCutoff: cutoff, rosterHeads: Set(heads))
            }

        case let .rename(target, name):
            if let reason = notActive(target) { return reason }
            if target != signer, let reason = notAdmin(signer) {
                return "\(reason) (a member may rename only itself)"
            }
            guard devices[target]!.name != name else { return "\(target.shortForm) already has that name" }
            devices[target]!.name = name

        case let .invite(hash, role, expiresAt):
            if let reason = notAdmin(signer) { return reason }
            guard invites[hash] == nil else { return "invite \(hash) already exists (token reused)" }
            invites[hash] = Roster.Invite(
                hash: hash, role: role, createdBy: signer, createdAt: entry.timestamp, expiresAt: expiresAt)

        case let .revokeInvite(hash):
            if let reason = notAdmin(signer) { return reason }
            guard var invite = invites[hash] else { return "there is no invite \(hash)" }
            if let usedBy = invite.usedBy { return "invite \(hash) was already used by \(usedBy.shortForm)" }
            if invite.revokedBy != nil { return "invite \(hash) was already revoked" }
            invite.revokedBy = signer
            invite.revokedAt = entry.timestamp
            invites[hash] = invite

        case let .enrol(token, name):
            let hash = token.hash
            guard var invite = invites[hash] else { return "there is no invite \(hash) (not made, or not by an admin)" }
            if let revokedBy = invite.revokedBy, let revokedAt = invite.revokedAt {
                return "invite \(hash) was revoked by \(revokedBy.shortForm) at \(revokedAt)"
            }
            if let usedBy = invite.usedBy { return "invite \(hash) was already used by \(usedBy.shortForm)" }
            if entry.timestamp.physicalMilliseconds > invite.expiresAt {
                return "invite \(hash) expired at \(wallClockText(invite.expiresAt))"
            }
            if let reason = cannotJoin(entry.signerKey) { return reason }
            invite.usedBy = signer
            invite.usedAt = entry.timestamp
            invites[hash] = invite
            devices[signer] = Roster.Device(
                id: signer, publicKey: entry.signerKey, name: name, role: invite.role, origin: .invited(hash),
                addedBy: invite.createdBy, addedAt: entry.timestamp, addedByEntry: entry.id, removal: nil)

        case let .writer(replica):
            if let reason = notActive(signer) { return reason }
            if let owner = writers[replica] {
                return owner == signer
                    ? "\(signer.shortForm) already claimed replica \(replica.shortDescription)"
                    : "replica \(replica.shortDescription) is already claimed by \(owner.shortForm)"
            }
            writers[replica] = signer

        case let .legacyEnrol(name, _, _):
            if let closedBy = legacyCloser, let closedAt = legacyClosedAt {
                return "legacy enrolment was closed by \(closedBy.shortForm) at \(closedAt)"
            }
            if let reason = cannotJoin(entry.signerKey) { return reason }
            devices[signer] = Roster.Device(
                id: signer, publicKey: entry.signerKey, name: name, role: .admin, origin: .legacySecret,
                addedBy: nil, addedAt: entry.timestamp, addedByEntry: entry.id, removal: nil)

        case let .closeLegacy(counted):
            if let reason = notAdmin(signer) { return reason }
            if legacyClosedBy == nil {
                legacyClosedBy = entry.id
                legacyClosedAt = entry.timestamp
                legacyCloser = signer
            }
            countedLegacyEnrols.formUnion(counted)
        }
        return nil
    }

    /// Entries that counted in this round but must not: entries of removed devices that their
    /// removers had not seen, and legacyEnrol entries that no counting closeLegacy lists.
    func impliedVoids(entries: [RosterEntryID: RosterEntry]) -> [RosterEntryID: String] {
        var voids: [RosterEntryID: String] = [:]
        for device in devices.values {
            guard let removal = device.removal else { continue }
            var seen: Set<RosterEntryID> = []
            var pending = Array(removal.rosterHeads)
            while let id = pending.popLast() {
                guard let entry = entries[id], entry.signer == device.id, seen.insert(id).inserted else { continue }
                if let previous = entry.previous { pending.append(previous) }
            }
            for id in effective where !seen.contains(id) {
                guard let entry = entries[id], entry.signer == device.id, entry.kind != .genesis else { continue }
                voids[id] = "signed by removed device \(device.id.shortForm) but not among its entries that "
                    + "\(removal.by.shortForm) had seen when removing it (made later, or backdated)"
            }
        }
        if legacyClosedBy != nil {
            for id in effective where !countedLegacyEnrols.contains(id) {
                guard let entry = entries[id], entry.kind == .legacyEnrol else { continue }
                voids[id] = "legacy enrolment was closed and this entry is not among those counted (made later, or backdated)"
            }
        }
        return voids
    }
}

/// `ms` since 1970 as ISO 8601 UTC, e.g. `2026-11-20T14:03:07Z` ("never" past the year 9999).
func wallClockText(_ ms: UInt64) -> String {
    guard ms <= 253_402_300_799_999 else { return "never" }
    return Date(timeIntervalSince1970: Double(ms) / 1000).ISO8601Format()
}
