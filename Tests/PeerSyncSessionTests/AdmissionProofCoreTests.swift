import Foundation
import PeerSync
@_spi(Engine) import PeerSyncCRDT
@testable import PeerSyncReplication
@testable import PeerSyncNetwork
import PeerSyncTestSupport
@testable import PeerSyncWire
import Testing
import ShiftSchedulerModel

/// A group made by invite, as `peersync init` and `init --join` make it: the admin's genesis and
/// invite, the joiner's enrol. Timestamps from the wall clock (the core checks them against it).
struct InvitedGroup {
    let admin = DeviceKey.generate()
    let member = DeviceKey.generate()
    let token = InviteToken.generate()
    let groupID: GroupID
    let genesis: RosterEntry
    let invite: RosterEntry
    let enrol: RosterEntry

    /// `createdAt`: when the admin made the group and the invite (wall-clock ms; default now).
    init(createdAt: UInt64? = nil, inviteExpiresAt: UInt64 = HybridLogicalClock.wallClock() + 3_600_000,
         enrolAt: HLCTimestamp? = nil) throws {
        var clock = HybridLogicalClock(physicalClock: { createdAt ?? HybridLogicalClock.wallClock() })
        genesis = try RosterEntry.genesis(groupName: "family", creatorName: "first phone", timestamp: clock.tick(), creator: admin)
        groupID = genesis.groupID
        invite = try RosterEntry.make(.invite(token.hash, role: .member, expiresAt: inviteExpiresAt),
                                      context: RosterEntryContext(groupID: groupID, timestamp: clock.tick(), previous: genesis.id),
                                      signer: admin)
        enrol = try RosterEntry.make(.enrol(token: token, name: "second phone"),
                                     context: RosterEntryContext(groupID: groupID, timestamp: enrolAt ?? clock.tick(), previous: nil),
                                     signer: member)
    }

    /// A state holding `entries` and a writer claim of its replica ID by `key`.
    static func state(_ name: String, _ entries: [RosterEntry], claimBy key: DeviceKey, group: GroupID,
                      replicaID: ReplicaID = .random()) throws -> ReplicaState {
        var state = ReplicaState(replicaID: replicaID, name: name)
        for entry in entries { state.write(entry.fields, to: entry.recordKey) }
        let roster = state.roster(of: group)
        let claim = try RosterEntry.make(.writer(state.replicaID), context: roster.context(for: key.deviceID, at: state.nextTimestamp()),
                                         signer: key)
        state.write(claim.fields, to: claim.recordKey)
        return state
    }

    /// The admin's node over its store before it admitted anyone.
    func adminState() throws -> ReplicaState { try Self.state("first phone", [genesis, invite], claimBy: admin, group: groupID) }
}

extension CoreNode {
    /// A node of device `key` of `group` over `state`.
    init(_ name: String, key: DeviceKey, group: GroupID, state: ReplicaState, pendingJoin: PendingJoin? = nil) {
        self.init(name, identity: LocalIdentity(key: key, groupID: group, pendingJoin: pendingJoin))
        self.state = state
        var settings = core.settings
        settings.localReplica = state.replicaID
        core = ReplicationCore(settings: settings, roster: state.roster(of: group))
    }

    /// Why the session ended on this side, if it was refused (by this side or the peer).
    func refusal(_ id: SessionID) -> SessionEndReason? {
        events.compactMap { event -> SessionEndReason? in
            if case .sessionRefused(_, let reason) = event { return reason }
            if case .peerDisconnected(_, let reason) = event { return reason }
            return nil
        }.first
    }

    var connectedPeers: Int { events.count { if case .peerConnected = $0 { true } else { false } } }

    func names() -> [String] { ((try? state.fetchAll(Location.self)) ?? []).map(\.name).sorted() }
}

/// Issue 29: an admin restored from a backup taken before it admitted a device must not lock that
/// device out; an enrol is never taken on trust; a removal is never undone.
@Suite("Replication core: proofs of admission")
struct AdmissionProofCoreTests {
    let t0 = ContinuousClock.now

    /// The joiner joins through the real flow (its enrol, the admin's confirmation); returns both
    /// nodes after it, the admin's store as it was before (its backup), and the joiner as it
    /// runs afterwards (joined).
    func joined(_ g: InvitedGroup) throws -> (admin: CoreNode, backup: ReplicaState, member: CoreNode) {
        let backup = try g.adminState()
        var admin = CoreNode("first phone", key: g.admin, group: g.groupID, state: backup)
        var joiner = CoreNode("second phone", key: g.member, group: g.groupID,
                              state: try InvitedGroup.state("second phone", [g.enrol], claimBy: g.member, group: g.groupID),
                              pendingJoin: PendingJoin(inviter: g.admin.deviceID, entry: g.enrol.bytes))
        try joiner.write { try $0.save(Location(name: "written by the joiner")) }
        var link = CoreLink.connect(&joiner, &admin, now: t0)
        try link.settle(&joiner, &admin, now: t0)
        #expect(admin.state.digest == joiner.state.digest)
        #expect(admin.state.roster(of: g.groupID).isActive(g.member.deviceID))
        link.end(&joiner, &admin)
        let member = CoreNode("second phone", key: g.member, group: g.groupID, state: joiner.state)
        return (admin, backup, member)
    }

    /// `state` restored as a copy: the same records and context, continued under a new replica
    /// ID that `key` claims.
    static func copy(of state: ReplicaState, claimBy key: DeviceKey, group: GroupID) throws -> ReplicaState {
        var copy = ReplicaState(replicaID: .random(), name: state.name, records: state.records, localSettings: [:], conflicts: ConflictLog())
        let roster = copy.roster(of: group)
        let claim = try RosterEntry.make(.writer(copy.replicaID), context: roster.context(for: key.deviceID, at: copy.nextTimestamp()),
                                         signer: key)
        copy.write(claim.fields, to: claim.recordKey)
        return copy
    }

    @Test("the admin signs a confirmation with the admission: an add of the joiner that sorts after its enrol and has no effect")
    func confirmationAtAdmission() throws {
        let g = try InvitedGroup()
        let (admin, _, member) = try joined(g)
        let roster = admin.state.roster(of: g.groupID)
        let adds = roster.entries.values.filter { $0.kind == .add }
        #expect(adds.count == 1)
        let add = try #require(adds.first)
        #expect(add.signer == g.admin.deviceID && add.timestamp > g.enrol.timestamp)
        #expect(add.payload == .add(device: g.member.publicKey, name: "second phone", role: .member))
        #expect(roster.devices[g.member.deviceID]?.origin == .invited(g.token.hash))  // the enrol admitted it
        #expect(roster.inviteStatus(g.token.hash, now: HybridLogicalClock.wallClock()) == .used(by: g.member.deviceID, at: g.enrol.timestamp))
        #expect(roster.isConfirmation(add))
        // The joiner's proof now rests on the add; its enrol and invite date its admission.
        #expect(member.state.roster(of: g.groupID).admissionProof(of: g.member.deviceID)?.map(\.id)
            == [add.id, g.genesis.id, g.invite.id, g.enrol.id])
    }

    @Test("an admin restored from before an admission (a copy: new replica ID) admits the member by its proof, with no live invite check; both converge")
    func restoredAdminAdmitsByProof() throws {
        let g = try InvitedGroup()
        let (_, backup, joinedMember) = try joined(g)
        // The backup comes back as a copy (a new incarnation), revokes the invite it thinks unused
        // — so a fresh join with it would be refused — and writes offline.
        var restored = CoreNode("first phone", key: g.admin, group: g.groupID, state: try Self.copy(of: backup, claimBy: g.admin, group: g.groupID))
        try restored.write { state in
            let roster = state.roster(of: g.groupID)
            let revoke = try RosterEntry.make(.revokeInvite(g.token.hash), context: roster.context(for: g.admin.deviceID, at: state.nextTimestamp()),
                                              signer: g.admin)
            return state.write(revoke.fields, to: revoke.recordKey)
        }
        try restored.write { try $0.save(Location(name: "written offline after the restore")) }
        #expect(restored.state.roster(of: g.groupID).devices[g.member.deviceID] == nil)
        var member = joinedMember
        var link = CoreLink.connect(&member, &restored, now: t0)
        try link.settle(&member, &restored, now: t0)

        let joins = link.framesToB.messages().compactMap { if case .join(let entries) = $0 { entries } else { nil } }
        #expect(joins.count == 1)
        let proof = try #require(joins.first).map { try RosterEntry(bytes: $0) }
        #expect(proof.first?.kind == .add && proof.first.map { $0.signer == g.admin.deviceID } == true)
        #expect(restored.logs.contains { $0.message == "admitting a device" && $0.metadata["admitted.by"] == "entries signed by admins" })
        #expect(restored.state.roster(of: g.groupID).isActive(g.member.deviceID))
        #expect(restored.connectedPeers == 1 && member.connectedPeers == 1)
        #expect(restored.state.digest == member.state.digest)
        #expect(restored.names() == ["written by the joiner", "written offline after the restore"])
        #expect(member.names() == restored.names())
        // The revocation came too late: the invite was used (the enrol sorts first).
        #expect(member.state.roster(of: g.groupID).inviteStatus(g.token.hash, now: HybridLogicalClock.wallClock())
            == .used(by: g.member.deviceID, at: g.enrol.timestamp))
    }

    @Test("a member's proof is sent only to a peer that may lack it")
    func proofOnlyWhenLacking() throws {
        let g = try InvitedGroup()
        var (admin, _, member) = try joined(g)
        var link = CoreLink.connect(&member, &admin, now: t0)
        try link.settle(&member, &admin, now: t0)
        #expect(!link.framesToB.messages().contains { if case .join = $0 { true } else { false } })
        #expect(admin.connectedPeers == 2)
    }

    @Test("an enrol-only proof is checked live: a backdated enrol with an expired, never-used invite is refused; with an open invite it is admitted and confirmed")
    func enrolOnlyProof() throws {
        let now = HybridLogicalClock.wallClock()
        for expired in [true, false] {
            // The intruder kept an invite code it never used; the invite expired ten minutes ago.
            // It dates its enrol before the expiry: its own roster counts it.
            // The invite was made two hours ago.
            let expiresAt = expired ? now - 600_000 : now + 600_000
            let g = try InvitedGroup(createdAt: now - 7_200_000, inviteExpiresAt: expiresAt,
                                     enrolAt: expired ? HLCTimestamp(physicalMilliseconds: expiresAt - 1_000, logical: 0) : nil)
            var admin = CoreNode("first phone", key: g.admin, group: g.groupID, state: try g.adminState())
            var intruder = CoreNode("intruder", key: g.member, group: g.groupID,
                                    state: try InvitedGroup.state("intruder", [g.genesis, g.invite, g.enrol], claimBy: g.member, group: g.groupID))
            #expect(intruder.state.roster(of: g.groupID).isActive(g.member.deviceID))
            try intruder.write { try $0.save(Location(name: "the intruder's")) }
            var link = CoreLink.connect(&intruder, &admin, now: t0)
            try link.settle(&intruder, &admin, now: t0)
            let roster = admin.state.roster(of: g.groupID)
            if expired {
                guard case .refused(.notAdmitted, let detail)? = admin.refusal(link.bSession) else {
                    Issue.record("not refused: \(admin.events)")
                    continue
                }
                #expect(detail.contains("was expired at"), "\(detail)")
                #expect(roster.devices[g.member.deviceID] == nil && admin.names().isEmpty)
                #expect(roster.entries[g.enrol.id] == nil)
            } else {
                #expect(roster.isActive(g.member.deviceID) && admin.names() == ["the intruder's"])
                #expect(roster.entries.values.contains { $0.kind == .add && $0.signer == g.admin.deviceID })
            }
        }
    }

    @Test("a removed device presenting its old proof is refused with reason 13, whether the peer knows its admission or only its removal")
    func removedDeviceRefused() throws {
        let g = try InvitedGroup()
        let (admin, _, member) = try joined(g)
        let roster = admin.state.roster(of: g.groupID)
        var clock = admin.state.clock
        let removal = try RosterEntry.make(roster.removal(of: g.member.deviceID, seen: admin.state.context),
                                           context: roster.context(for: g.admin.deviceID, at: clock.tick()), signer: g.admin)
        // Knows the admission and the removal; knows only the removal (a ban).
        let knowing = try InvitedGroup.state("first phone", roster.entries.values.map { $0 } + [removal], claimBy: g.admin, group: g.groupID)
        let banning = try InvitedGroup.state("first phone", [g.genesis, g.invite, removal], claimBy: g.admin, group: g.groupID)
        for state in [knowing, banning] {
            var peer = CoreNode("first phone", key: g.admin, group: g.groupID, state: state)
            var removed = member
            #expect(removed.state.roster(of: g.groupID).admissionProof(of: g.member.deviceID) != nil)
            var link = CoreLink.connect(&removed, &peer, now: t0)
            try link.settle(&removed, &peer, now: t0)
            guard case .refused(.deviceRemoved, _)? = peer.refusal(link.bSession) else {
                Issue.record("not refused as removed: \(peer.events)")
                continue
            }
            #expect(peer.state.roster(of: g.groupID).isRemoved(g.member.deviceID))
            #expect(peer.connectedPeers == 0)
        }
    }

    @Test("restored in place with its dots reused, the admin refuses the member once; the member's next session carries its proof and is admitted")
    func proofAfterRefusal() throws {
        let g = try InvitedGroup()
        let (_, backup, joinedMember) = try joined(g)
        // Written over in place: the same replica ID, and two offline writes take the counters
        // the admission used — the member's dots look known to the admin.
        var restored = CoreNode("first phone", key: g.admin, group: g.groupID, state: backup)
        try restored.write { try $0.save(Location(name: "offline one")) }
        try restored.write { try $0.save(Location(name: "offline two")) }
        var member = joinedMember
        let admissionDots = member.state.records.records(in: RosterEntry.collection).compactMap { $0.1.fields[RosterEntry.field]?.dot }
            .filter { $0.replica == restored.replicaID }
        #expect(!admissionDots.isEmpty && admissionDots.allSatisfy { restored.state.context.contains($0) })

        var first = CoreLink.connect(&member, &restored, now: t0)
        try first.settle(&member, &restored, now: t0)
        guard case .refused(.notAdmitted, let detail)? = restored.refusal(first.bSession) else {
            Issue.record("the first session was not refused: \(restored.events)")
            return
        }
        #expect(detail == "data before admission")
        #expect(!first.framesToB.messages().contains { if case .join = $0 { true } else { false } })

        var second = CoreLink.connect(&member, &restored, now: t0)
        try second.settle(&member, &restored, now: t0)
        #expect(second.framesToB.messages().contains { if case .join = $0 { true } else { false } })
        #expect(restored.state.roster(of: g.groupID).isActive(g.member.deviceID))
        #expect(restored.names().contains("written by the joiner"), "\(restored.logs) \(restored.events) \(member.logs)")
        #expect(restored.connectedPeers == 1)
    }

    @Test("restored in place, the admin learns it from the member's hello before it writes the admission under its old replica ID")
    func restoreDetectedBeforeAdmission() throws {
        let g = try InvitedGroup()
        let (_, backup, joinedMember) = try joined(g)
        var restored = CoreNode("first phone", key: g.admin, group: g.groupID, state: backup)
        try restored.write { try $0.save(Location(name: "offline")) }  // one write: the member knows more of its replica
        var member = joinedMember
        let before = restored.state.context
        var link = CoreLink.connect(&member, &restored, now: t0)
        try link.settle(&member, &restored, now: t0)
        #expect(link.framesToB.messages().contains { if case .join = $0 { true } else { false } })
        guard case .refused(.replicaRestored, _)? = restored.refusal(link.bSession) else {
            Issue.record("not refused as restored: \(restored.events)")
            return
        }
        #expect(restored.events.contains { if case .restoredStoreDetected = $0 { true } else { false } })
        #expect(restored.state.context == before)  // nothing written under the old ID
    }

    @Test("a restored admin that still counts a removed device admits it until a member's round brings the removal, then closes it with 13")
    func removalWindow() throws {
        let g = try InvitedGroup()
        var (admin, _, member) = try joined(g)
        let third = DeviceKey.generate()
        try admin.write { state in
            let roster = state.roster(of: g.groupID)
            let add = try RosterEntry.make(.add(device: third.publicKey, name: "tablet", role: .member),
                                           context: roster.context(for: g.admin.deviceID, at: state.nextTimestamp()), signer: g.admin)
            return state.write(add.fields, to: add.recordKey)
        }
        let backup = admin.state  // the second phone is a member here
        var tablet = CoreNode("tablet", key: third, group: g.groupID,
                              state: try InvitedGroup.state("tablet", backup.roster(of: g.groupID).entries.values.map { $0 }, claimBy: third,
                                                            group: g.groupID))
        // The admin removes the second phone, and the tablet learns it.
        try admin.write { state in
            let roster = state.roster(of: g.groupID)
            let removal = try RosterEntry.make(roster.removal(of: g.member.deviceID, seen: state.context),
                                               context: roster.context(for: g.admin.deviceID, at: state.nextTimestamp()), signer: g.admin)
            return state.write(removal.fields, to: removal.recordKey)
        }
        var toTablet = CoreLink.connect(&tablet, &admin, now: t0)
        try toTablet.settle(&tablet, &admin, now: t0)
        #expect(tablet.state.roster(of: g.groupID).isRemoved(g.member.deviceID))
        toTablet.end(&tablet, &admin)

        // The admin is restored (as a copy) from before the removal: the removed phone gets in...
        var restored = CoreNode("first phone", key: g.admin, group: g.groupID, state: try Self.copy(of: backup, claimBy: g.admin, group: g.groupID))
        var phoneLink = CoreLink.connect(&member, &restored, now: t0)
        try phoneLink.settle(&member, &restored, now: t0)
        #expect(restored.connectedPeers == 1)
        // ...until the tablet's round brings the removal: its session ends with 13.
        var tabletLink = CoreLink.connect(&tablet, &restored, now: t0)
        try tabletLink.settle(&tablet, &restored, now: t0)
        #expect(restored.state.roster(of: g.groupID).isRemoved(g.member.deviceID))
        try phoneLink.settle(&member, &restored, now: t0)
        #expect(restored.events.contains {
            if case .peerDisconnected(_, .refused(.deviceRemoved, _)) = $0 { true } else { false }
        }, "\(restored.events)")
    }
}
