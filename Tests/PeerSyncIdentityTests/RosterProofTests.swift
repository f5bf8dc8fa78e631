import Foundation
@_spi(Engine) import PeerSyncCRDT
@testable import PeerSyncIdentity
import PeerSyncTestSupport
import Testing

/// Proofs of admission and admins' confirmations (issue 29: a restored admin must not lock out
/// the devices it admitted after its backup).
@Suite("Identity: proofs of admission")
struct RosterProofTests {
    /// A group: the creator invites a member, who enrols; `confirmed` adds the creator's
    /// confirmation (an add of the member's key, name and role) after the enrol.
    struct Joined {
        var s: Scenario
        let member = DeviceKey.generate()
        let token = InviteToken.generate()
        let invite: RosterEntry
        let enrol: RosterEntry
        var confirmation: RosterEntry?

        init(confirmed: Bool, expiresAt: UInt64 = 100_000) throws {
            s = try Scenario()
            invite = try s.sign(.invite(token.hash, role: .member, expiresAt: expiresAt), by: s.creator, at: 2_000)
            enrol = try s.sign(.enrol(token: token, name: "phone"), by: member, at: 3_000)
            if confirmed {
                confirmation = try s.sign(.add(device: member.publicKey, name: "phone", role: .member), by: s.creator, at: 3_001)
            }
        }

        var genesis: RosterEntry { s.entries[0] }
    }

    @Test("a confirmed member's proof is the admin's add, the genesis, its invite and enrol; the adds alone admit it, in a roster from before the admission too")
    func confirmedProof() throws {
        let j = try Joined(confirmed: true)
        let roster = j.s.roster
        // The confirmation has no effect here: the enrol admitted the device and used the invite.
        #expect(roster.devices[j.member.deviceID]?.origin == .invited(j.token.hash))
        #expect(roster.inviteStatus(j.token.hash, now: 4_000) == .used(by: j.member.deviceID, at: ts(3_000)))
        #expect(roster.isConfirmation(j.confirmation!))
        #expect(!roster.isConfirmation(j.enrol))
        #expect(roster.confirmation(of: j.member.deviceID, by: j.s.creator.deviceID) == nil)

        let proof = try #require(roster.admissionProof(of: j.member.deviceID))
        #expect(proof.map(\.id) == [j.confirmation!.id, j.genesis.id, j.invite.id, j.enrol.id])
        #expect(Roster(groupID: j.s.groupID, entries: proof).isActive(j.member.deviceID))
        #expect(Roster(groupID: j.s.groupID, entries: proof.filter { $0.kind != .enrol }).isActive(j.member.deviceID))
        // A restored admin's roster: the genesis and the invite, nothing of the admission. With
        // the proof it evaluates as the member's roster: admitted from the enrol on.
        let restored = Roster(groupID: j.s.groupID, entries: [j.genesis, j.invite])
        let validation = restored.validate(incoming: proof)
        #expect(validation.refused.isEmpty)
        #expect(Set(validation.accepted.map(\.id)) == [j.confirmation!.id, j.enrol.id])
        #expect(RosterSummary(validation.roster) == RosterSummary(roster))
        // The creator's proof is its genesis.
        #expect(roster.admissionProof(of: j.s.creator.deviceID)?.map(\.id) == [j.genesis.id])
    }

    @Test("without a confirmation the proof is the enrol, its invite and the genesis — which alone would admit a backdated enrol, so peers check it live")
    func enrolProof() throws {
        let j = try Joined(confirmed: false)
        let roster = j.s.roster
        let proof = try #require(roster.admissionProof(of: j.member.deviceID))
        #expect(proof.map(\.id) == [j.enrol.id, j.genesis.id, j.invite.id])
        #expect(roster.confirmation(of: j.member.deviceID, by: j.s.creator.deviceID)
            == .add(device: j.member.publicKey, name: "phone", role: .member))
        #expect(roster.confirmation(of: j.member.deviceID, by: j.member.deviceID) == nil)  // not an admin

        // An expired, never-used invite and an enrol dated before the expiry: the roster's rule
        // counts it (it only sees the enrol's own timestamp); only the live check refuses it.
        var late = try Joined(confirmed: false, expiresAt: 3_500)
        let intruder = DeviceKey.generate()
        let token = InviteToken.generate()
        let unused = try late.s.sign(.invite(token.hash, role: .admin, expiresAt: 3_500), by: late.s.creator, at: 2_100)
        let forged = try late.s.sign(.enrol(token: token, name: "x"), by: intruder, at: 3_200)
        #expect(late.s.roster.role(of: intruder.deviceID) == .admin)
        let before = Roster(groupID: late.s.groupID, entries: [late.genesis, unused])
        #expect(before.validate(incoming: [forged]).refused.isEmpty)
        #expect(before.joinRefusal(token: token, now: 10_000) == "invite \(token.hash) was expired at 1970-01-01T00:00:03Z")
    }

    @Test("a member invited by a second admin proves its admission through both admins' adds")
    func chain() throws {
        var s = try Scenario()
        let second = DeviceKey.generate()
        let member = DeviceKey.generate()
        let token = InviteToken.generate()
        let addSecond = try s.add(second, name: "second", role: .admin, by: s.creator, at: 2_000)
        let invite = try s.sign(.invite(token.hash, role: .member, expiresAt: 100_000), by: second, at: 2_500)
        let enrol = try s.sign(.enrol(token: token, name: "member"), by: member, at: 3_000)
        #expect(s.roster.confirmationsDue(by: second.deviceID, heardFrom: [s.creator.deviceID]).count == 1)
        #expect(s.roster.confirmationsDue(by: s.creator.deviceID, heardFrom: [second.deviceID]).isEmpty)  // not its inviter
        let add = try s.add(member, name: "member", by: second, at: 3_001)
        let proof = try #require(s.roster.admissionProof(of: member.deviceID))
        #expect(proof.map(\.id) == [add.id, s.entries[0].id, addSecond.id, invite.id, enrol.id])
        #expect(Roster(groupID: s.groupID, entries: proof).isActive(member.deviceID))
        // The second admin's own proof, and none for a device that is not a member.
        #expect(s.roster.admissionProof(of: second.deviceID)?.map(\.id) == [addSecond.id, s.entries[0].id])
        #expect(s.roster.admissionProof(of: DeviceKey.generate().deviceID) == nil)
    }

    @Test("confirmations due: by the inviter, only after a round from another device, once; a removed device never")
    func confirmationsDue() throws {
        var j = try Joined(confirmed: false)
        let admin = j.s.creator.deviceID
        let other = DeviceKey.generate().deviceID
        #expect(j.s.roster.confirmationsDue(by: admin, heardFrom: []).isEmpty)
        // From the device itself: enough only while it is the only other active device.
        #expect(j.s.roster.confirmationsDue(by: admin, heardFrom: [j.member.deviceID]).count == 1)
        var three = j
        try three.s.add(DeviceKey.generate(), name: "third", by: three.s.creator, at: 3_100)
        #expect(three.s.roster.confirmationsDue(by: admin, heardFrom: [j.member.deviceID]).isEmpty)
        #expect(three.s.roster.confirmationsDue(by: admin, heardFrom: [j.member.deviceID, other]).count == 1)
        #expect(j.s.roster.confirmationsDue(by: admin, heardFrom: [j.member.deviceID, other])
            == [.add(device: j.member.publicKey, name: "phone", role: .member)])
        #expect(j.s.roster.confirmationsDue(by: j.member.deviceID, heardFrom: [other]).isEmpty)  // a member signs none
        // Renamed since: the confirmation carries the name and role it has now.
        try j.s.sign(.rename(device: j.member.deviceID, name: "new name"), by: j.member, at: 3_500)
        #expect(j.s.roster.confirmation(of: j.member.deviceID, by: admin)
            == .add(device: j.member.publicKey, name: "new name", role: .member))
        // Removed: no proof, no confirmation.
        var removed = j
        try removed.s.sign(.remove(device: j.member.deviceID, dataCutoff: [:], rosterHeads: removed.s.roster.heads(of: j.member.deviceID)),
                           by: removed.s.creator, at: 4_000)
        #expect(removed.s.roster.admissionProof(of: j.member.deviceID) == nil)
        #expect(removed.s.roster.confirmationsDue(by: admin, heardFrom: [other]).isEmpty)
        // Confirmed: nothing more is due.
        try j.s.sign(.add(device: j.member.publicKey, name: "new name", role: .member), by: j.s.creator, at: 3_600)
        #expect(j.s.roster.confirmationsDue(by: admin, heardFrom: [other]).isEmpty)
    }

    @Test("a confirmation signed by an admin that did not know of a removal cannot undo it, in either order")
    func confirmationAfterRemoval() throws {
        for confirmedAt: UInt64 in [3_900, 5_000] {
            var j = try Joined(confirmed: false)
            let removal = try j.s.sign(.remove(device: j.member.deviceID, dataCutoff: [:], rosterHeads: j.s.roster.heads(of: j.member.deviceID)),
                                       by: j.s.creator, at: 4_000)
            // The admin restored from before the removal signs its confirmation.
            let withoutRemoval = j.s.entries.filter { $0.id != removal.id }
            let late = try j.s.sign(.add(device: j.member.publicKey, name: "phone", role: .member), by: j.s.creator, at: confirmedAt,
                                    seeing: withoutRemoval)
            let roster = j.s.roster
            #expect(roster.isRemoved(j.member.deviceID), "confirmation at \(confirmedAt)")
            #expect(roster.admissionProof(of: j.member.deviceID) == nil)
            #expect(roster.isConfirmation(late) == (confirmedAt < 4_000))
        }
    }
}
