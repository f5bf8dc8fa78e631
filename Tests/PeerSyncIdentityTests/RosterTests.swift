import Foundation
@_spi(Engine) import PeerSyncCRDT
@testable import PeerSyncIdentity
import PeerSyncTestSupport
import Testing

/// What must be identical between two evaluations of the same entries.
struct RosterSummary: Equatable {
    let name: String?
    let devices: [DeviceID: Roster.Device]
    let banned: [DeviceID: Roster.Removal]
    let writers: [ReplicaID: DeviceID]
    let invites: [InviteHash: Roster.Invite]
    let effective: Set<RosterEntryID>
    let ineffective: [Roster.IneffectiveEntry]
    let legacyClosedBy: RosterEntryID?

    init(_ r: Roster) {
        name = r.groupName
        devices = r.devices
        banned = r.banned
        writers = r.writers
        invites = r.invites
        effective = r.effective
        ineffective = r.ineffective
        legacyClosedBy = r.legacyClosedBy
    }
}

func reason(_ roster: Roster, _ entry: RosterEntry) -> String? {
    roster.ineffective.first { $0.entry.id == entry.id }?.reason
}

@Suite("Identity: roster evaluation")
struct RosterTests {
    @Test("the creator is the first admin; the group ID is the genesis entry's ID")
    func creator() throws {
        let s = try Scenario()
        let roster = s.roster
        #expect(roster.groupID == GroupID(bytes: s.entries[0].id.bytes))
        #expect(roster.groupName == "Ward 7")
        #expect(roster.role(of: s.creator.deviceID) == .admin)
        #expect(roster.devices[s.creator.deviceID]?.origin == .createdGroup)
        #expect(roster.activeDevices.map(\.id) == [s.creator.deviceID])
        #expect(roster.ineffective.isEmpty)
        // Evaluated as another group, the genesis is set aside.
        let other = Roster(groupID: GroupID(bytes: [UInt8](repeating: 9, count: 16))!, entries: s.entries)
        #expect(other.devices.isEmpty)
        #expect(other.ineffective.first?.reason.hasPrefix("it belongs to group") == true)
    }

    @Test("a recovery key signs as an admin and a relay does not; neither is a device, nor counts as the last admin")
    func recoveryKeysAndRelays() throws {
        var s = try Scenario()
        let recovery = DeviceKey.generate()
        let relay = DeviceKey.generate()
        let newcomer = DeviceKey.generate()
        let stranger = DeviceKey.generate()
        try s.add(recovery, name: "recovery key", role: .recovery, by: s.creator, at: 2_000)
        try s.add(relay, name: "relay", role: .relay, by: s.creator, at: 2_100)
        let byRecovery = try s.add(newcomer, name: "new phone", role: .admin, by: recovery, at: 3_000)
        let byRelay = try s.add(stranger, name: "x", role: .member, by: relay, at: 3_100)
        let roster = s.roster
        #expect(roster.role(of: newcomer.deviceID) == .admin, "\(String(describing: reason(roster, byRecovery)))")
        #expect(roster.devices[stranger.deviceID] == nil)
        #expect(reason(roster, byRelay)?.contains("not an admin") == true)
        #expect(roster.recoveryKeys.map(\.id) == [recovery.deviceID])
        #expect(roster.relays.map(\.id) == [relay.deviceID])
        #expect(Set(roster.activeDevices.map(\.id)) == [s.creator.deviceID, newcomer.deviceID])
        #expect(roster.deviceAdmins.count == 2)
    }

    @Test("a member cannot add, remove or invite: the entry has no effect and validate refuses it")
    func memberRights() throws {
        var s = try Scenario()
        let member = DeviceKey.generate()
        let stranger = DeviceKey.generate()
        try s.add(member, name: "member", by: s.creator, at: 2_000)
        let before = s.roster
        let add = try s.sign(.add(device: stranger.publicKey, name: "x", role: .admin), by: member, at: 3_000)
        let remove = try s.sign(.remove(device: s.creator.deviceID, dataCutoff: [:], rosterHeads: []), by: member, at: 3_100)
        let invite = try s.sign(.invite(InviteToken.generate().hash, role: .admin, expiresAt: .max), by: member, at: 3_200)
        let roster = s.roster
        let memberShort = member.deviceID.shortForm
        #expect(reason(roster, add) == "\(memberShort) is not an admin")
        #expect(reason(roster, remove) == "\(memberShort) is not an admin")
        #expect(reason(roster, invite) == "\(memberShort) is not an admin")
        #expect(!roster.isActive(stranger.deviceID))
        #expect(roster.role(of: s.creator.deviceID) == .admin)
        #expect(roster.ineffective.map(\.description).first
            == "roster entry add \(add.id.shortDescription) by \(memberShort) has no effect: \(memberShort) is not an admin")

        let validation = before.validate(incoming: [add, remove, invite])
        #expect(validation.accepted.isEmpty)
        #expect(validation.refused.count == 3)
        #expect(validation.refused.allSatisfy { $0.kind == .notYet && $0.reason.contains("has never been an admin") })
        // A stranger's entries: unknown signer.
        let foreign = try RosterEntry.make(.writer(ReplicaID(high: 1, low: 1)), context: before.context(for: stranger.deviceID, at: ts(4_000)),
                                           signer: stranger)
        #expect(before.validate(incoming: [foreign]).refused.first?.reason == "signer \(stranger.deviceID.shortForm) is not a known device")
    }

    @Test("removal wins over a concurrent promotion and a later re-add; a ban stops a first add")
    func removalWins() throws {
        var s = try Scenario()
        let admin = s.creator
        let other = DeviceKey.generate()
        let x = DeviceKey.generate()
        try s.add(other, name: "other admin", role: .admin, by: admin, at: 2_000)
        try s.add(x, name: "x", by: admin, at: 3_000)
        let seenBeforeRemoval = s.entries
        let removal = try s.sign(s.roster.removal(of: x.deviceID, seen: CausalContext()), by: admin, at: 5_000)
        // Concurrent (did not see the removal), later timestamp: promotes x.
        let promotion = try s.sign(.add(device: x.publicKey, name: "x", role: .admin), by: other, at: 5_500, seeing: seenBeforeRemoval)
        // After seeing the removal: re-add.
        let reAdd = try s.sign(.add(device: x.publicKey, name: "x again", role: .member), by: admin, at: 6_000)
        var roster = s.roster
        #expect(roster.effective.contains(removal.id))
        #expect(!roster.isActive(x.deviceID))
        #expect(roster.isRemoved(x.deviceID))
        #expect(reason(roster, promotion)?.contains("a removed device cannot join again") == true)
        #expect(reason(roster, reAdd)?.contains("a removed device cannot join again") == true)
        #expect(roster.devices[x.deviceID]?.removal?.by == admin.deviceID)

        // A concurrent promotion that sorts before the removal applies, then the removal removes.
        var t = try Scenario(creator: admin)
        try t.add(other, name: "other admin", role: .admin, by: admin, at: 2_000)
        try t.add(x, name: "x", by: admin, at: 3_000)
        let seen = t.entries
        try t.sign(.remove(device: x.deviceID, dataCutoff: [:], rosterHeads: []), by: admin, at: 5_000)
        let early = try t.sign(.add(device: x.publicKey, name: "x", role: .admin), by: other, at: 4_500, seeing: seen)
        roster = t.roster
        #expect(roster.effective.contains(early.id))
        #expect(!roster.isActive(x.deviceID))

        // Removing a device before it ever joined bans it.
        let y = DeviceKey.generate()
        try t.sign(.remove(device: y.deviceID, dataCutoff: [:], rosterHeads: []), by: other, at: 7_000)
        let addY = try t.add(y, name: "y", by: admin, at: 8_000)
        roster = t.roster
        #expect(roster.banned[y.deviceID] != nil)
        #expect(!roster.isActive(y.deviceID))
        #expect(reason(roster, addY)?.contains("cannot join again") == true)
    }

    @Test("a removed key cannot enrol with a new invite nor be legacy-enrolled")
    func removedCannotEnrol() throws {
        var s = try Scenario()
        let admin = s.creator
        let x = DeviceKey.generate()
        let first = InviteToken.generate()
        try s.sign(.invite(first.hash, role: .member, expiresAt: 1_000_000), by: admin, at: 2_000)
        try s.sign(.enrol(token: first, name: "x"), by: x, at: 2_500)
        #expect(s.roster.role(of: x.deviceID) == .member)
        #expect(s.roster.devices[x.deviceID]?.origin == .invited(first.hash))
        #expect(s.roster.devices[x.deviceID]?.addedBy == admin.deviceID)
        try s.sign(s.roster.removal(of: x.deviceID, seen: CausalContext()), by: admin, at: 3_000)
        let second = InviteToken.generate()
        try s.sign(.invite(second.hash, role: .member, expiresAt: 1_000_000), by: admin, at: 3_500)
        let enrol = try s.sign(.enrol(token: second, name: "x again"), by: x, at: 4_000)
        let roster = s.roster
        #expect(!roster.isActive(x.deviceID))
        #expect(reason(roster, enrol)?.contains("a removed device cannot join again") == true)
        #expect(roster.inviteStatus(second.hash, now: 4_000) == .open(expiresAt: 1_000_000)) // not consumed
    }

    @Test("mutual removal: the earlier removal counts, whatever the order of arrival; one admin remains")
    func mutualRemoval() throws {
        var s = try Scenario()
        let a = s.creator
        let b = DeviceKey.generate()
        try s.add(b, name: "b", role: .admin, by: a, at: 2_000)
        let seen = s.entries
        let view = Roster(groupID: s.groupID, entries: seen)
        let aRemovesB = try s.sign(view.removal(of: b.deviceID, seen: CausalContext()), by: a, at: 5_000, seeing: seen)
        let bRemovesA = try s.sign(view.removal(of: a.deviceID, seen: CausalContext()), by: b, at: 5_001, seeing: seen)
        let forward = Roster(groupID: s.groupID, entries: seen + [aRemovesB, bRemovesA])
        let backward = Roster(groupID: s.groupID, entries: seen + [bRemovesA, aRemovesB])
        #expect(RosterSummary(forward) == RosterSummary(backward))
        #expect(forward.role(of: a.deviceID) == .admin)
        #expect(!forward.isActive(b.deviceID))
        #expect(reason(forward, bRemovesA)?.hasPrefix("\(b.deviceID.shortForm) was removed by \(a.deviceID.shortForm)") == true)
        // Replicas that got them one at a time agree too.
        let oneByOne = Roster(groupID: s.groupID, entries: seen).adding([bRemovesA]).adding([aRemovesB])
        #expect(RosterSummary(oneByOne) == RosterSummary(forward))

        // Same timestamp: the lower signer device ID goes first.
        var t = try Scenario(creator: a)
        try t.add(b, name: "b", role: .admin, by: a, at: 2_000)
        let tSeen = t.entries
        let tView = Roster(groupID: t.groupID, entries: tSeen)
        try t.sign(tView.removal(of: b.deviceID, seen: CausalContext()), by: a, at: 5_000, seeing: tSeen)
        try t.sign(tView.removal(of: a.deviceID, seen: CausalContext()), by: b, at: 5_000, seeing: tSeen)
        let tie = t.roster
        let (winner, loser) = a.deviceID < b.deviceID ? (a, b) : (b, a)
        #expect(tie.role(of: winner.deviceID) == .admin)
        #expect(!tie.isActive(loser.deviceID))
        #expect(tie.activeDevices.count == 1)
    }

    @Test("a removal that omits heads its signer must have seen voids them, and may void itself: still deterministic")
    func omittedHeads() throws {
        var s = try Scenario()
        let a = s.creator
        let b = DeviceKey.generate()
        try s.add(b, name: "b", role: .admin, by: a, at: 2_000)
        // b removes a but lists none of a's entries, not even the add that made b a member.
        let bad = try s.sign(.remove(device: a.deviceID, dataCutoff: [:], rosterHeads: []), by: b, at: 3_000)
        let roster = s.roster
        // Round 1: b removes a; implied: a's add of b is void. Round 2: b was never a member, so
        // its removal has no effect; a's add of b stays void (voids are never lifted).
        #expect(roster.role(of: a.deviceID) == .admin)
        #expect(!roster.isActive(b.deviceID))
        #expect(reason(roster, bad) == "\(b.deviceID.shortForm) is not a member")
        var rng = SeededGenerator(seed: baseSeed &+ 1)
        for _ in 0..<20 {
            #expect(RosterSummary(Roster(groupID: s.groupID, entries: s.entries.shuffled(using: &rng))) == RosterSummary(roster))
        }
    }

    @Test("a group keeps an admin: the last admin cannot remove or demote itself")
    func lastAdmin() throws {
        var s = try Scenario()
        let removeSelf = try s.sign(.remove(device: s.creator.deviceID, dataCutoff: [:], rosterHeads: []), by: s.creator, at: 2_000)
        let demote = try s.sign(.add(device: s.creator.publicKey, name: "creator", role: .member), by: s.creator, at: 2_100)
        let roster = s.roster
        #expect(roster.role(of: s.creator.deviceID) == .admin)
        #expect(reason(roster, removeSelf) == "removing \(s.creator.deviceID.shortForm) would leave the group without an admin")
        #expect(reason(roster, demote) == "demoting \(s.creator.deviceID.shortForm) would leave the group without an admin")
    }

    @Test("an invite admits one device: the second enrol with the same token has no effect")
    func inviteSingleUse() throws {
        var s = try Scenario()
        let token = InviteToken.generate()
        try s.sign(.invite(token.hash, role: .admin, expiresAt: 100_000), by: s.creator, at: 2_000)
        let j1 = DeviceKey.generate()
        let j2 = DeviceKey.generate()
        let before = s.roster
        let first = try s.sign(.enrol(token: token, name: "j1"), by: j1, at: 3_000)
        let second = try s.sign(.enrol(token: token, name: "j2"), by: j2, at: 3_500)
        let roster = s.roster
        #expect(roster.role(of: j1.deviceID) == .admin)
        #expect(!roster.isActive(j2.deviceID))
        #expect(reason(roster, second) == "invite \(token.hash) was already used by \(j1.deviceID.shortForm)")
        #expect(roster.inviteStatus(token.hash, now: 4_000) == .used(by: j1.deviceID, at: ts(3_000)))
        #expect(roster.joinRefusal(token: token, now: 4_000)?.hasPrefix("invite \(token.hash) was already used by") == true)
        // Validation accepts both (well formed), and reports the second as having no effect.
        let validation = before.validate(incoming: [second, first])
        #expect(validation.accepted.count == 2)
        #expect(validation.noEffect.map(\.entry.id) == [second.id])
        #expect(validation.roster.isActive(j1.deviceID))
        #expect(s.entries.count == 4)
    }

    @Test("an enrol after the invite's expiry has no effect, and the live check says expired")
    func inviteExpiry() throws {
        var s = try Scenario()
        let token = InviteToken.generate()
        try s.sign(.invite(token.hash, role: .member, expiresAt: 5_000), by: s.creator, at: 2_000)
        let before = s.roster
        #expect(before.joinRefusal(token: token, now: 4_999) == nil)
        #expect(before.joinRefusal(token: token, now: 5_001) == "invite \(token.hash) was expired at 1970-01-01T00:00:05Z")
        let late = try s.sign(.enrol(token: token, name: "late"), by: .generate(), at: 5_001)
        #expect(reason(s.roster, late) == "invite \(token.hash) expired at 1970-01-01T00:00:05Z")
        #expect(before.validate(incoming: [late]).refused.first?.kind == .notYet)
        let onTime = try s.sign(.enrol(token: token, name: "on time"), by: .generate(), at: 5_000)
        #expect(s.roster.isActive(onTime.signer))
        #expect(before.joinRefusal(token: InviteToken.generate(), now: 1)?.contains("is unknown to this group") == true)
        #expect(Roster.InviteStatus.open(expiresAt: .max).description == "open until never")
        #expect(Roster.InviteStatus.open(expiresAt: 86_400_000).description == "open until 1970-01-02T00:00:00Z")
    }

    @Test("a revoked invite admits nobody; only admins revoke")
    func revokedInvite() throws {
        var s = try Scenario()
        let member = DeviceKey.generate()
        try s.add(member, name: "m", by: s.creator, at: 1_500)
        let token = InviteToken.generate()
        try s.sign(.invite(token.hash, role: .member, expiresAt: 100_000), by: s.creator, at: 2_000)
        let byMember = try s.sign(.revokeInvite(token.hash), by: member, at: 2_400)
        try s.sign(.revokeInvite(token.hash), by: s.creator, at: 2_500)
        let enrol = try s.sign(.enrol(token: token, name: "j"), by: .generate(), at: 3_000)
        let roster = s.roster
        #expect(reason(roster, byMember) == "\(member.deviceID.shortForm) is not an admin")
        #expect(reason(roster, enrol)?.hasPrefix("invite \(token.hash) was revoked by \(s.creator.deviceID.shortForm)") == true)
        #expect(roster.inviteStatus(token.hash, now: 3_000) == .revoked(by: s.creator.deviceID, at: ts(2_500)))
        #expect(roster.joinRefusal(token: token, now: 3_000)?.contains("was revoked by") == true)
    }

    @Test("rename: a device renames itself, an admin renames anyone, a member nobody else")
    func rename() throws {
        var s = try Scenario()
        let m = DeviceKey.generate()
        let n = DeviceKey.generate()
        try s.add(m, name: "m", by: s.creator, at: 2_000)
        try s.add(n, name: "n", by: s.creator, at: 2_100)
        try s.sign(.rename(device: m.deviceID, name: "Mia's tablet"), by: m, at: 3_000)
        let bad = try s.sign(.rename(device: n.deviceID, name: "hijacked"), by: m, at: 3_100)
        try s.sign(.rename(device: n.deviceID, name: "Noah's phone"), by: s.creator, at: 3_200)
        let roster = s.roster
        #expect(roster.devices[m.deviceID]?.name == "Mia's tablet")
        #expect(roster.devices[n.deviceID]?.name == "Noah's phone")
        #expect(reason(roster, bad) == "\(m.deviceID.shortForm) is not an admin (a member may rename only itself)")
    }

    @Test("writer claims: the first claim of a replica ID wins, in evaluation order")
    func writerClaims() throws {
        var s = try Scenario()
        let m = DeviceKey.generate()
        let n = DeviceKey.generate()
        try s.add(m, name: "m", by: s.creator, at: 2_000)
        try s.add(n, name: "n", by: s.creator, at: 2_100)
        let r1 = ReplicaID(high: 1, low: 1)
        let r2 = ReplicaID(high: 2, low: 2)
        let seen = s.entries
        let nClaim = try s.sign(.writer(r1), by: n, at: 3_100, seeing: seen)
        try s.sign(.writer(r1), by: m, at: 3_000, seeing: seen) // arrives later, sorts first
        try s.sign(.writer(r2), by: n, at: 3_200)
        let roster = s.roster
        #expect(roster.claimant(of: r1) == m.deviceID)
        #expect(roster.claimant(of: r2) == n.deviceID)
        #expect(roster.claimant(of: ReplicaID(high: 3, low: 3)) == nil)
        #expect(reason(roster, nClaim) == "replica \(r1.shortDescription) is already claimed by \(m.deviceID.shortForm)")
    }

    @Test("a removed device's writes are refused beyond the cutoff; several removals merge to the maximum")
    func cutoff() throws {
        var s = try Scenario()
        let a = s.creator
        let b = DeviceKey.generate()
        let m = DeviceKey.generate()
        try s.add(b, name: "b", role: .admin, by: a, at: 1_500)
        try s.add(m, name: "m", by: a, at: 2_000)
        let r = ReplicaID(high: 5, low: 5)
        let other = ReplicaID(high: 6, low: 6)
        try s.sign(.writer(r), by: m, at: 2_500)
        let seen = s.entries
        let aSeen = CausalContext(versionVector: [r: 7, other: 3])
        let bSeen = CausalContext(versionVector: [r: 9])
        try s.sign(Roster(groupID: s.groupID, entries: seen).removal(of: m.deviceID, seen: aSeen), by: a, at: 3_000, seeing: seen)
        let roster1 = s.roster
        #expect(roster1.devices[m.deviceID]?.removal?.dataCutoff == [r: 7])
        #expect(roster1.refusal(of: Dot(replica: r, counter: 7)) == nil)
        #expect(roster1.refusal(of: Dot(replica: r, counter: 8)) == Roster.DotRefusal(dot: Dot(replica: r, counter: 8), device: m.deviceID, cutoff: 7))
        #expect(roster1.refusal(of: Dot(replica: other, counter: 100)) == nil) // unclaimed: claimant(of:) says so
        #expect(roster1.claimant(of: other) == nil)
        try s.sign(Roster(groupID: s.groupID, entries: seen).removal(of: m.deviceID, seen: bSeen), by: b, at: 3_001, seeing: seen)
        let roster2 = s.roster
        #expect(roster2.devices[m.deviceID]?.removal?.dataCutoff == [r: 9])
        #expect(roster2.refusal(of: Dot(replica: r, counter: 9)) == nil)
        #expect(roster2.refusal(of: Dot(replica: r, counter: 10)) != nil)
        #expect(roster2.devices[m.deviceID]?.removal?.by == a.deviceID)
    }

    @Test("a removed admin cannot backdate: entries its remover had not seen are void")
    func backdating() throws {
        var s = try Scenario()
        let a = s.creator
        let b = DeviceKey.generate()
        let c = DeviceKey.generate()
        let puppet = DeviceKey.generate()
        try s.add(b, name: "b", role: .admin, by: a, at: 2_000)
        let addC = try s.add(c, name: "c", by: b, at: 2_500)
        try s.sign(.writer(ReplicaID(high: 7, low: 7)), by: b, at: 2_600)
        try s.sign(s.roster.removal(of: b.deviceID, seen: CausalContext()), by: a, at: 5_000)
        // After its removal, b signs entries dated before it.
        let puppetAdd = try s.sign(.add(device: puppet.publicKey, name: "puppet", role: .admin), by: b, at: 4_000)
        let lateClaim = try s.sign(.writer(ReplicaID(high: 8, low: 8)), by: b, at: 4_500)
        let roster = s.roster
        #expect(roster.effective.contains(addC.id)) // seen by the remover: still counts
        #expect(roster.isActive(c.deviceID))
        #expect(!roster.isActive(puppet.deviceID))
        #expect(reason(roster, puppetAdd)?.contains("not among its entries that \(a.deviceID.shortForm) had seen") == true)
        #expect(reason(roster, lateClaim)?.contains("not among its entries") == true)
        #expect(roster.claimant(of: ReplicaID(high: 7, low: 7)) == b.deviceID)
        #expect(roster.claimant(of: ReplicaID(high: 8, low: 8)) == nil)
        #expect(roster.rounds == 2)
    }

    @Test("legacy enrolment: the proof admits as admin until closed; later or backdated ones are void")
    func legacy() throws {
        let secret = (0..<20).map { UInt8($0 * 3) }
        let legacy = LegacyGroupKey(groupSecret: secret)
        let group = legacy.groupID
        var entries = [try RosterEntry.legacyGenesis(groupName: "Old ward", timestamp: ts(1_000), legacyKey: legacy)]
        func enrol(_ key: DeviceKey, at ms: UInt64) throws -> RosterEntry {
            let context = Roster(groupID: group, entries: entries).context(for: key.deviceID, at: ts(ms))
            let entry = try RosterEntry.legacyEnrol(name: "dev", context: context, device: key, legacyKey: legacy)
            entries.append(entry)
            return entry
        }
        let d1 = DeviceKey.generate()
        let d2 = DeviceKey.generate()
        _ = try enrol(d1, at: 2_000)
        _ = try enrol(d2, at: 2_100)
        // A second legacyGenesis (another device upgrading) changes nothing.
        let secondName = try RosterEntry.legacyGenesis(groupName: "Other name", timestamp: ts(1_500), legacyKey: legacy)
        entries.append(secondName)
        var roster = Roster(groupID: group, entries: entries)
        #expect(roster.groupName == "Old ward")
        #expect(roster.role(of: d1.deviceID) == .admin)
        #expect(roster.devices[d2.deviceID]?.origin == .legacySecret)
        #expect(reason(roster, secondName) == "the group is already named")

        let close = try RosterEntry.make(roster.closingLegacyEnrolment(), context: roster.context(for: d1.deviceID, at: ts(5_000)), signer: d1)
        entries.append(close)
        let after = try enrol(.generate(), at: 6_000)
        let backdated = try enrol(.generate(), at: 3_000)
        roster = Roster(groupID: group, entries: entries)
        #expect(roster.isLegacyEnrolmentClosed)
        #expect(roster.isActive(d1.deviceID) && roster.isActive(d2.deviceID))
        #expect(!roster.isActive(after.signer))
        #expect(!roster.isActive(backdated.signer))
        #expect(reason(roster, after)?.hasPrefix("legacy enrolment was closed by") == true)
        #expect(reason(roster, backdated)?.contains("not among those counted") == true)

        // A removed key cannot legacy-enrol again.
        let d3 = DeviceKey.generate()
        var open = Array(entries.prefix(3))
        let d3Enrol = try RosterEntry.legacyEnrol(name: "d3", context: RosterEntryContext(groupID: group, timestamp: ts(2_200), previous: nil),
                                                  device: d3, legacyKey: legacy)
        open.append(d3Enrol)
        let removeD3 = try RosterEntry.make(Roster(groupID: group, entries: open).removal(of: d3.deviceID, seen: CausalContext()),
                                            context: Roster(groupID: group, entries: open).context(for: d1.deviceID, at: ts(2_300)), signer: d1)
        open.append(removeD3)
        let again = try RosterEntry.legacyEnrol(name: "d3", context: RosterEntryContext(groupID: group, timestamp: ts(2_400), previous: d3Enrol.id),
                                                device: d3, legacyKey: legacy)
        open.append(again)
        let reopened = Roster(groupID: group, entries: open)
        #expect(!reopened.isActive(d3.deviceID))
        #expect(reason(reopened, again)?.contains("cannot join again") == true)
    }

    @Test("evaluation does not depend on the order of the entries (100 shuffles)")
    func orderIndependence() throws {
        var s = try Scenario()
        let a = s.creator
        let b = DeviceKey.generate()
        let m = DeviceKey.generate()
        let j = DeviceKey.generate()
        try s.add(b, name: "b", role: .admin, by: a, at: 2_000)
        try s.add(m, name: "m", by: b, at: 2_100)
        let token = InviteToken.generate()
        try s.sign(.invite(token.hash, role: .member, expiresAt: 10_000), by: a, at: 2_200)
        let seen = s.entries
        try s.sign(.enrol(token: token, name: "j"), by: j, at: 3_000, seeing: seen)
        try s.sign(.enrol(token: token, name: "k"), by: .generate(), at: 3_000, seeing: seen)
        try s.sign(.writer(ReplicaID(high: 1, low: 1)), by: m, at: 3_100, seeing: seen)
        try s.sign(.writer(ReplicaID(high: 1, low: 1)), by: b, at: 3_100, seeing: seen)
        try s.sign(.rename(device: m.deviceID, name: "mm"), by: m, at: 3_200, seeing: seen)
        try s.sign(.remove(device: b.deviceID, dataCutoff: [:], rosterHeads: []), by: a, at: 4_000, seeing: seen)
        try s.sign(.remove(device: a.deviceID, dataCutoff: [:], rosterHeads: []), by: b, at: 4_000, seeing: seen)
        try s.sign(.add(device: m.publicKey, name: "m", role: .admin), by: b, at: 3_900, seeing: seen)
        try s.sign(.add(device: DeviceKey.generate().publicKey, name: "late", role: .member), by: b, at: 4_500)
        let reference = RosterSummary(s.roster)
        #expect(!reference.ineffective.isEmpty)
        var rng = SeededGenerator(seed: baseSeed)
        for _ in 0..<100 {
            let shuffled = s.entries.shuffled(using: &rng)
            #expect(RosterSummary(Roster(groupID: s.groupID, entries: shuffled + shuffled.prefix(3))) == reference)
        }
    }
}

@Suite("Identity: validating incoming roster entries")
struct RosterValidationTests {
    @Test("malformed records, other groups' entries and deletions are refused as malformed")
    func malformed() throws {
        var s = try Scenario()
        let m = DeviceKey.generate()
        let addM = try s.add(m, name: "m", by: s.creator, at: 2_000)
        let base = Roster(groupID: s.groupID, entries: [s.entries[0]])
        let elsewhere = try Scenario()
        var tampered = addM.bytes
        tampered[40] ^= 1
        let validation = base.validate(records: [
            (addM.id.uuid, addM.fields),
            (elsewhere.entries[0].id.uuid, elsewhere.entries[0].fields),
            (UUID(), addM.fields),
            (addM.id.uuid, ["e": .bytes(tampered)]),
        ])
        #expect(validation.accepted.map(\.id) == [addM.id])
        #expect(validation.refused.count == 3)
        #expect(validation.refused.allSatisfy { $0.kind == .malformed })
        #expect(validation.hasMalformed)
        #expect(validation.refused.contains { $0.reason.hasPrefix("it is the genesis of another group") })
        #expect(validation.refused.contains { $0.reason.contains("altered or misfiled") })
        #expect(validation.roster.isActive(m.deviceID))
        #expect(base.validate(incoming: [s.entries[0]]).alreadyKnown == 1)
        // A record held already, byte for byte, is known without decoding; the same record ID
        // with other bytes is still decoded, and refused.
        let held = Roster(groupID: s.groupID, entries: [s.entries[0], addM])
        let again = held.validate(records: [(addM.id.uuid, addM.fields), (addM.id.uuid, ["e": .bytes(tampered)])])
        #expect(again.alreadyKnown == 1)
        #expect(again.accepted.isEmpty)
        #expect(again.refused.count == 1 && again.hasMalformed)
    }

    @Test("a delta that deletes a roster record is refused; a delta that adds one is accepted")
    func deltas() throws {
        var s = try Scenario()
        let m = DeviceKey.generate()
        let addM = try s.add(m, name: "m", by: s.creator, at: 2_000)
        let replica = ReplicaID(high: 1, low: 1)
        var map = RecordMap()
        for entry in s.entries { try map.write(entry.fields, to: entry.recordKey, at: entry.timestamp, by: replica) }
        let base = Roster(groupID: s.groupID, entries: [s.entries[0]])
        let accepted = base.validate(delta: map)
        #expect(accepted.accepted.map(\.id) == [addM.id])
        #expect(accepted.alreadyKnown == 1)
        #expect(accepted.refused.isEmpty)
        let deletion = try must(map.remove(addM.recordKey, by: replica))
        let refused = s.roster.validate(delta: deletion)
        #expect(refused.refused.map(\.reason) == ["it deletes a roster record (the roster is add-only)"])
        #expect(refused.hasMalformed)
    }

    @Test("an entry refused for lack of a known admin is accepted once the promotion arrives in the same batch")
    func notYetThenAccepted() throws {
        var s = try Scenario()
        let m = DeviceKey.generate()
        let x = DeviceKey.generate()
        let addM = try s.add(m, name: "m", by: s.creator, at: 2_000)
        let promote = try s.sign(.add(device: m.publicKey, name: "m", role: .admin), by: s.creator, at: 2_500)
        let addX = try s.add(x, name: "x", by: m, at: 3_000)
        let base = Roster(groupID: s.groupID, entries: [s.entries[0]])
        let early = base.validate(incoming: [addM, addX])
        #expect(early.refused.map(\.kind) == [.notYet])
        let full = base.validate(incoming: [addX, promote, addM])
        #expect(full.refused.isEmpty)
        #expect(full.roster.isActive(x.deviceID))
    }

    @Test("no entry vouches for itself: a member's self-promotion and a device it adds in the same batch are refused as not yet")
    func selfPromotion() throws {
        var s = try Scenario()
        let m = DeviceKey.generate()
        let x = DeviceKey.generate()
        try s.add(m, name: "m", by: s.creator, at: 2_000)
        let base = s.roster
        let promote = try s.sign(.add(device: m.publicKey, name: "m", role: .admin), by: m, at: 3_000)
        let addX = try s.add(x, name: "x", role: .admin, by: m, at: 3_100)
        let validation = base.validate(incoming: [promote, addX])
        #expect(validation.accepted.isEmpty)
        #expect(validation.refused.map(\.kind) == [.notYet, .notYet])
        #expect(validation.refused.allSatisfy { $0.reason == "\(m.deviceID.shortForm) has never been an admin; add needs an admin" })
        #expect(validation.roster.role(of: m.deviceID) == .member)
        #expect(validation.roster.devices[x.deviceID] == nil)
        // What x signs is not introduced by an add that was refused.
        let claim = try RosterEntry.make(.writer(ReplicaID(high: 5, low: 5)), context: base.context(for: x.deviceID, at: ts(3_200)),
                                         signer: x)
        #expect(base.validate(incoming: [promote, addX, claim]).refused.last?.reason
            == "signer \(x.deviceID.shortForm) is not a known device")
    }

    @Test("authority must be rooted: two members promoting each other, or a member's invite and its enrol, are refused")
    func circularAuthority() throws {
        var s = try Scenario()
        let (m, n, joiner) = (DeviceKey.generate(), DeviceKey.generate(), DeviceKey.generate())
        try s.add(m, name: "m", by: s.creator, at: 2_000)
        try s.add(n, name: "n", by: s.creator, at: 2_100)
        let base = s.roster
        let mPromotesN = try s.sign(.add(device: n.publicKey, name: "n", role: .admin), by: m, at: 3_000)
        let nPromotesM = try s.sign(.add(device: m.publicKey, name: "m", role: .admin), by: n, at: 3_000)
        let circle = base.validate(incoming: [mPromotesN, nPromotesM])
        #expect(circle.accepted.isEmpty)
        #expect(circle.refused.map(\.kind) == [.notYet, .notYet])

        // A member's own admin invite, used by a key of its own: the invite proves nothing.
        let token = InviteToken.generate()
        let invite = try s.sign(.invite(token.hash, role: .admin, expiresAt: .max), by: m, at: 3_100)
        let enrol = try s.sign(.enrol(token: token, name: "sock puppet"), by: joiner, at: 3_200)
        let reAdd = try s.sign(.add(device: m.publicKey, name: "m", role: .admin), by: joiner, at: 3_300)
        let puppet = base.validate(incoming: [invite, enrol, reAdd])
        #expect(puppet.accepted.isEmpty)
        #expect(puppet.refused.map(\.reason) == [
            "\(m.deviceID.shortForm) has never been an admin; invite needs an admin",
            "no invite \(token.hash) is known",
            "signer \(joiner.deviceID.shortForm) is not a known device",
        ])
    }

    @Test("a chain of authority arriving in one batch, in any order, is accepted: admin adds y as admin, y adds z as admin, z invites, w enrols")
    func chainInOneBatch() throws {
        var s = try Scenario()
        let (y, z, w) = (DeviceKey.generate(), DeviceKey.generate(), DeviceKey.generate())
        let base = s.roster
        let token = InviteToken.generate()
        let chain = [
            try s.add(y, name: "y", role: .admin, by: s.creator, at: 2_000),
            try s.add(z, name: "z", role: .admin, by: y, at: 3_000),
            try s.sign(.invite(token.hash, role: .admin, expiresAt: .max), by: z, at: 4_000),
            try s.sign(.enrol(token: token, name: "w"), by: w, at: 5_000),
            try s.sign(.writer(ReplicaID(high: 7, low: 7)), by: w, at: 5_100),
        ]
        for batch in [chain, chain.reversed()] {
            let validation = base.validate(incoming: batch)
            #expect(validation.refused.isEmpty)
            #expect(Set(validation.accepted.map(\.id)) == Set(chain.map(\.id)))
            #expect(validation.roster.role(of: w.deviceID) == .admin)
            #expect(validation.roster.claimant(of: ReplicaID(high: 7, low: 7)) == w.deviceID)
        }
    }

    @Test("a removed device's later entry is stored but has no effect")
    func afterRemoval() throws {
        var s = try Scenario()
        let m = DeviceKey.generate()
        try s.add(m, name: "m", by: s.creator, at: 2_000)
        try s.sign(.remove(device: m.deviceID, dataCutoff: [:], rosterHeads: []), by: s.creator, at: 3_000)
        let base = s.roster
        let late = try RosterEntry.make(.writer(ReplicaID(high: 4, low: 4)), context: base.context(for: m.deviceID, at: ts(4_000)), signer: m)
        let validation = base.validate(incoming: [late])
        #expect(validation.accepted.map(\.id) == [late.id])
        #expect(validation.noEffect.map(\.reason) == ["\(m.deviceID.shortForm) was removed by \(s.creator.deviceID.shortForm) at \(ts(3_000))"])
        #expect(validation.roster.claimant(of: ReplicaID(high: 4, low: 4)) == nil)
    }
}
