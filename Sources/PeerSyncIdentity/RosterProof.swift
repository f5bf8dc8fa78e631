@_spi(Engine) import PeerSyncCRDT

/// Proofs of admission, and the admins' confirmations that make them independent of invites.
///
/// A member whose peer lacks the entries that admitted it — a peer restored from a backup older
/// than the admission, or one that was offline since — presents them (PROTOCOL.md §6.4, "A
/// member the peer does not know"). The proof is the smallest chain this roster holds from the
/// group's root (genesis, or a legacy enrolment) to the device: preferably `add` entries signed by
/// admins, which a peer can check by signature alone. An `enrol` proves nothing on its own to a
/// peer that lacks it — the roster's rule compares the enrol's own timestamp with the invite's
/// expiry, and a device holding an expired, never-used code could backdate one — so a peer takes
/// an enrol it did not hold only through the live checks of a fresh join. That is why the admin
/// who admits a joiner by its enrol also signs a **confirmation**: an `add` of the same key, name
/// and role, sorting after the enrol (where it has no effect).
extension Roster {
    /// Most entries in one proof (the join message's bound, PROTOCOL.md §5.10).
    public static let maxProofEntries = 64

    /// The entries that prove `device` is a member, or nil if it is not active here (or no chain
    /// is found within a bounded search): the entry that admits it comes first, then the entries
    /// that authorise it back to the group's root — all of them entries of this roster, which
    /// alone make the device active in a roster holding nothing else.
    ///
    /// The chain runs through admins' `add` entries where it can (the newest add of the device,
    /// usually its confirmation, then its signer's, back to the genesis or a legacy enrolment):
    /// a peer admits on those by signature alone. A device that came in by an invite also
    /// presents its enrol, the invite and the inviter's chain, although a peer takes none of
    /// them on trust (PROTOCOL.md §6.4): they date its admission from the enrol, before its
    /// confirmation, so that what it signed in between (the writer claim it makes when it joins)
    /// counts at once — a peer whose context hides the enrol (counters reused by an in-place
    /// restore) would otherwise refuse its writes as unclaimed. The group's creator's proof is its
    /// genesis alone.
    ///
    /// - Complexity: at most 64 evaluations of a roster of at most ``maxProofEntries`` entries.
    package func admissionProof(of device: DeviceID) -> [RosterEntry]? {
        guard isActive(device) else { return nil }
        var search = ProofSearch(self)
        let byAdds = search.chain(for: device, admin: false, before: nil, enrols: false)
        var byEnrol: [RosterEntry]?
        if case .invited = devices[device]?.origin { byEnrol = search.chain(for: device, admin: false, before: nil, enrols: true) }
        guard let admitting = byAdds?.last ?? byEnrol?.last else { return nil }
        var seen: Set<RosterEntryID> = [admitting.id]
        let proof = [admitting] + ((byAdds ?? []) + (byEnrol ?? [])).filter { seen.insert($0.id).inserted }
        return proof.count <= Self.maxProofEntries ? proof : nil
    }

    /// The devices some `add` entry names (counting or not).
    var addedDevices: Set<DeviceID> {
        Set(entries.values.compactMap { entry in
            if case .add(let key, _, _) = entry.payload { return key.deviceID }
            return nil
        })
    }

    /// Whether `device`'s admission needs an admin's confirmation: it is active, it came in by an
    /// enrol (an invite), and no `add` of its key exists yet (`added`: ``addedDevices``).
    func needsConfirmation(_ device: Device, added: Set<DeviceID>) -> Bool {
        guard device.isActive, case .invited = device.origin else { return false }
        return !added.contains(device.id)
    }

    /// Whether `entry` is a confirmation that has no effect here, by design: an add of a device
    /// that an earlier entry admitted (and that was not removed before it). Not worth a warning.
    package func isConfirmation(_ entry: RosterEntry) -> Bool {
        guard case .add(let key, _, _) = entry.payload, !effective.contains(entry.id), let device = devices[key.deviceID],
              let admitted = entries[device.addedByEntry], Self.evaluationOrder(admitted, entry) else { return false }
        return device.removal.map { entry.timestamp < $0.at } ?? true
    }

    /// The confirmation `admin` signs for `device` right after admitting it by its enrol: an add
    /// with the device's key, name and role; nil if `admin` is not an active admin or the device
    /// needs none.
    package func confirmation(of device: DeviceID, by admin: DeviceID) -> RosterPayload? {
        guard role(of: admin) == .admin, let target = devices[device], needsConfirmation(target, added: addedDevices) else { return nil }
        return .add(device: target.publicKey, name: target.name, role: target.role)
    }

    /// The confirmations `admin` owes (for groups whose devices were admitted before
    /// confirmations existed): one per active device admitted by an enrol without an add of its
    /// key, whose inviter is `admin` — or, if the inviter is no longer an active admin, whose
    /// confirmation falls to the active admin with the lowest device ID. At most 64 at a time.
    ///
    /// `heardFrom`: devices whose catch-up round this node has stored since it started. A device
    /// is confirmed only once a round from some *other* device arrived (or from the device
    /// itself if it is the only other active one), which brings that device's roster — so an
    /// admin restored from a backup older than a removal learns the removal from the group
    /// before it would confirm the removed device. (A confirmation signed after a removal it did
    /// not know could not undo it anyway: it sorts after the removal, and a removed key never
    /// joins again.)
    package func confirmationsDue(by admin: DeviceID, heardFrom: Set<DeviceID>) -> [RosterPayload] {
        guard role(of: admin) == .admin,
              devices.values.contains(where: { if case .invited = $0.origin { $0.isActive } else { false } }) else { return [] }
        let added = addedDevices
        let active = devices.values.filter { $0.isActive && $0.role.isDevice }
        let lowestAdmin = active.filter { $0.role == .admin }.map(\.id).min()
        let due = devices.values.filter { device in
            guard needsConfirmation(device, added: added) else { return false }
            let onlyOther = active.count == 2 && heardFrom.contains(device.id)
            guard onlyOther || !heardFrom.subtracting([device.id, admin]).isEmpty else { return false }
            if device.addedBy == admin { return true }
            let inviterAdmin = device.addedBy.map { role(of: $0) == .admin } ?? false
            return !inviterAdmin && lowestAdmin == admin
        }
        return due.sorted { $0.id < $1.id }.prefix(64).map { .add(device: $0.publicKey, name: $0.name, role: $0.role) }
    }
}

/// The bounded depth-first search behind ``Roster/admissionProof(of:)``.
private struct ProofSearch {
    let roster: Roster
    var adds: [DeviceID: [RosterEntry]] = [:]
    var enrolsBySigner: [DeviceID: [RosterEntry]] = [:]
    var legacyEnrols: [DeviceID: [RosterEntry]] = [:]
    var invites: [InviteHash: [RosterEntry]] = [:]
    var genesis: RosterEntry?
    /// Calls and roster evaluations left: the search gives up (no proof) beyond.
    var calls = 256
    var evaluations = 64

    init(_ roster: Roster) {
        self.roster = roster
        for id in roster.order {
            let entry = roster.entries[id]!
            switch entry.payload {
            case .genesis: if roster.effective.contains(id) { genesis = entry }
            case .add(let key, _, _): adds[key.deviceID, default: []].append(entry)
            case .enrol: enrolsBySigner[entry.signer, default: []].append(entry)
            case .legacyEnrol: if roster.effective.contains(id) { legacyEnrols[entry.signer, default: []].append(entry) }
            case .invite(let hash, _, _): invites[hash, default: []].append(entry)
            default: break
            }
        }
    }

    /// Entries, in evaluation order with the admitting entry last, that make `device` active (an
    /// admin if `admin`) in a roster holding only them, every one sorting before `limit`.
    /// `enrols`: the device itself comes in by its enrol (its signers' chains prefer adds).
    mutating func chain(for device: DeviceID, admin: Bool, before limit: RosterEntry?, enrols: Bool = false) -> [RosterEntry]? {
        guard calls > 0 else { return nil }
        calls -= 1
        func earlier(_ entry: RosterEntry) -> Bool { limit.map { Roster.evaluationOrder(entry, $0) } ?? true }
        if let genesis, genesis.signer == device { return earlier(genesis) ? [genesis] : nil }
        if let legacy = legacyEnrols[device]?.first(where: earlier) { return [legacy] }
        // Adds, newest first (the current role and name, usually a confirmation).
        for add in (enrols ? [] : adds[device] ?? []).reversed() where earlier(add) && add.signer != device {
            if admin, case .add(_, _, .member) = add.payload { continue }
            guard let signer = chain(for: add.signer, admin: true, before: add) else { continue }
            if holds(signer + [add], device, admin: admin) { return signer + [add] }
        }
        for enrol in enrolsBySigner[device] ?? [] where earlier(enrol) {
            guard case .enrol(let token, _) = enrol.payload else { continue }
            for invite in invites[token.hash] ?? [] where Roster.evaluationOrder(invite, enrol) {
                guard let signer = chain(for: invite.signer, admin: true, before: invite) else { continue }
                if holds(signer + [invite, enrol], device, admin: admin) { return signer + [invite, enrol] }
            }
        }
        return nil
    }

    mutating func holds(_ entries: [RosterEntry], _ device: DeviceID, admin: Bool) -> Bool {
        guard evaluations > 0 else { return false }
        evaluations -= 1
        let alone = Roster(groupID: roster.groupID, entries: entries)
        return admin ? alone.role(of: device)?.signsAsAdmin ?? false : alone.isActive(device)
    }
}
