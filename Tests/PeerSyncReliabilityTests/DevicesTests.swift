import Foundation
import Logging
import NIOCore
import NIOPosix
import PeerSync
@_spi(Engine) import PeerSyncCRDT
@testable import PeerSyncReplication
@testable import PeerSyncNetwork
import PeerSyncTestSupport
import PeerSyncWire
import Testing
import ShiftSchedulerModel

/// Devices, not a shared password (issue 12): invites that are single-use and expire, removal
/// that takes effect everywhere within seconds, and roster entries checked on every node. Real
/// stores, real TCP on 127.0.0.1, mutual TLS 1.3 with device certificates.
@Suite("Devices", .ownThread, .serialized)
struct DevicesTests {
    /// A replica in a temporary directory, logging into `lines` when given.
    final class Device: @unchecked Sendable {
        let directory: String
        let replica: Replica
        var port: UInt16 = 0
        let lines = RecordingLogHandler.Lines()

        init(level: Logger.Level = .info, _ make: (String, Logger) throws -> Replica) throws {
            directory = try makeTemporaryDirectory("peersync-device")
            replica = try make(directory, RecordingLogHandler.logger("device", into: lines, level: level))
        }

        @discardableResult
        func sync(_ peers: [Device] = [], limits: SyncLimits = SyncLimits()) async throws -> UInt16 {
            port = try await replica.startSync(SyncConfiguration(security: .tls, listen: .loopback(0),
                                                                 peers: peers.map { .loopback($0.port) }, limits: limits))
            return port
        }

        func connected(to other: Device) async -> Bool {
            await replica.peers().contains { $0.info.deviceID == other.replica.deviceID }
        }

        func names() -> [String] { ((try? replica.fetchAll(Location.self)) ?? []).map(\.name).sorted() }

        func close() async {
            await replica.stopSync()
            removeTemporaryDirectory(directory)
        }
    }

    func statusText(_ device: Device) async -> String {
        if case .error(let issue) = await device.replica.currentStatus { return "\(issue)" }
        return ""
    }

    @Test("three devices join with three single-use invites and sync; a reused or an expired invite is refused and nothing crosses")
    func invites() async throws {
        let admin = try Device { try Replica.create(at: $0, name: "admin", logger: $1) }
        defer { Task { await admin.close() } }
        try await admin.replica.save(Location(name: "the admin's"))
        try await admin.sync()
        var joiners: [Device] = []
        var codes: [InviteCode] = []
        for i in 0..<3 {
            let code = try await admin.replica.invite(role: .member)
            codes.append(code)
            let joiner = try Device { try Replica.join(at: $0, name: "joiner \(i)", invite: code, logger: $1) }
            try await joiner.replica.save(Location(name: "joiner \(i)'s"))
            try await joiner.sync([admin])
            joiners.append(joiner)
        }
        let joined = joiners
        defer { Task { for joiner in joined { await joiner.close() } } }
        let everyone = ["joiner 0's", "joiner 1's", "joiner 2's", "the admin's"]
        #expect(await eventually {
            admin.replica.roster().activeDevices.count == 4 && ([admin] + joiners).allSatisfy { $0.names() == everyone }
        })
        #expect(await eventually {
            for joiner in joiners where await joiner.replica.pendingJoin != nil { return false }
            return true
        })

        // The first code again, on a fourth device: refused, and nothing crosses either way.
        let fourth = try Device { try Replica.join(at: $0, name: "fourth", invite: codes[0], logger: $1) }
        defer { Task { await fourth.close() } }
        try await fourth.replica.save(Location(name: "the fourth's"))
        var limits = SyncLimits()
        limits.rejectedDialBackoff = Backoff(first: .seconds(2), max: .seconds(4))  // shorter than 5 s → 5 min, to see it
        try await fourth.sync([admin], limits: limits)
        #expect(await eventually { await statusText(fourth).contains("already used") })
        #expect(fourth.names() == ["the fourth's"])
        #expect(!admin.names().contains("the fourth's"))
        #expect(admin.replica.roster().devices[fourth.replica.deviceID] == nil)
        #expect(admin.lines.all.contains { $0.contains("already used") })
        // It backs off as from any refusal (the rejected backoff, not the 0.2 s of a lost
        // connection) and says why once, not at every attempt (the third starts after two ended).
        #expect(await eventually(timeout: .seconds(30)) { await fourth.replica.syncHealth().limits.dialAttempts >= 3 })
        let said = fourth.lines.all.filter { $0.contains("already used") }
        #expect(said.count == 1 && said.allSatisfy { $0.hasPrefix("warning peer disconnected") }, "\(fourth.lines.all)")
        let redials = fourth.lines.all.filter { $0.contains("dialed peer refused") }
        #expect(redials.count == 1 && redials.allSatisfy { $0.contains("dial.retryInSeconds=1") || $0.contains("dial.retryInSeconds=2") },
                "\(redials)")

        // An invite that expired before it was used: refused.
        let shortLived = try await admin.replica.invite(expires: .milliseconds(20))
        let expiry = HybridLogicalClock.wallClock() + 20
        #expect(await eventually { HybridLogicalClock.wallClock() > expiry })
        let late = try Device { try Replica.join(at: $0, name: "late", invite: shortLived, logger: $1) }
        defer { Task { await late.close() } }
        try await late.sync([admin])
        #expect(await eventually { await statusText(late).contains("expired") })
        #expect(late.names().isEmpty)

        // A revoked invite: refused with "revoked"; revoking it (or a used one) again says why not.
        let revoked = try await admin.replica.invite()
        try await admin.replica.revokeInvite(revoked)
        await #expect { try await admin.replica.revokeInvite(revoked) } throws: { error in
            if case .deviceAdministration(.inviteNotOpen)? = error as? ReplicaError { true } else { false }
        }
        await #expect { try await admin.replica.revokeInvite(codes[1]) } throws: { error in
            if case .deviceAdministration(.inviteNotOpen)? = error as? ReplicaError { true } else { false }
        }
        let turnedAway = try Device { try Replica.join(at: $0, name: "turned away", invite: revoked, logger: $1) }
        defer { Task { await turnedAway.close() } }
        try await turnedAway.sync([admin])
        #expect(await eventually { await statusText(turnedAway).contains("revoked") })
        #expect(turnedAway.names().isEmpty)
        #expect(admin.replica.roster().devices[turnedAway.replica.deviceID] == nil)
    }

    @Test("a device that kept an expired, never-used invite and dates its enrol before the expiry is refused by the live check; nothing crosses")
    func backdatedEnrol() async throws {
        let admin = try Device { try Replica.create(at: $0, name: "admin", logger: $1) }
        defer { Task { await admin.close() } }
        try await admin.replica.save(Location(name: "the admin's"))
        try await admin.sync()
        let code = try await admin.replica.invite(expires: .milliseconds(20))
        let expiry = try #require(admin.replica.roster().invites[code.token.hash]?.expiresAt)
        #expect(await eventually { HybridLogicalClock.wallClock() > expiry })
        // The intruder's store holds the group's entries and an enrol dated before the expiry:
        // its own roster counts it, so it takes itself for a member and presents its proof.
        let directory = try makeTemporaryDirectory("peersync-intruder")
        defer { removeTemporaryDirectory(directory) }
        var joining: Replica? = try Replica.join(at: directory, name: "intruder", invite: code)
        let key = try DeviceKey.load(from: directory + "/" + Replica.deviceKeyFile)
        let backdated = try RosterEntry.make(.enrol(token: code.token, name: "intruder"),
                                             context: RosterEntryContext(groupID: code.groupID, timestamp: HLCTimestamp(
                                                 physicalMilliseconds: expiry - 1, logical: 0), previous: nil), signer: key)
        try await joining!.commit { state in
            var delta = RecordMap.empty()
            for entry in Array(admin.replica.roster().entries.values) + [backdated] { delta.merge(state.write(entry.fields, to: entry.recordKey)) }
            return delta
        }
        joining = nil
        let lines = RecordingLogHandler.Lines()
        let intruder = try Replica.open(at: directory, logger: RecordingLogHandler.logger("intruder", into: lines))
        #expect(intruder.roster().isActive(key.deviceID))
        #expect(await intruder.pendingJoin == nil)
        try await intruder.save(Location(name: "the intruder's"))
        _ = try await intruder.startSync(SyncConfiguration(security: .tls, listen: .loopback(0), peers: [.loopback(admin.port)]))
        #expect(await eventually { admin.lines.all.contains { $0.contains("invite \(code.token.hash) was expired at") } },
                "\(admin.lines.all.filter { $0.contains("warning") })")
        #expect(admin.replica.roster().devices[key.deviceID] == nil)
        #expect(admin.names() == ["the admin's"])
        #expect(try intruder.fetchAll(Location.self).map(\.name) == ["the intruder's"])
        await intruder.stopSync()
    }

    @Test("a removed device: every node that learns of it drops its sessions within 5 s; its edits never land, members' never reach it")
    func removal() async throws {
        let group = try LocalGroup.make(names: ["A", "B", "C", "D"])
        let devices = try (0..<4).map { i in try Device { try Replica.create(at: $0, member: i, of: group, logger: $1) } }
        defer { Task { for device in devices { await device.close() } } }
        let (a, b, c, d) = (devices[0], devices[1], devices[2], devices[3])
        // B, C and D dial A; D also dials C (so C could forward what D writes).
        try await a.sync()
        try await c.sync([a])
        try await b.sync([a])
        try await d.sync([a, c])
        #expect(await eventually {
            let (da, dc, ba) = (await d.connected(to: a), await d.connected(to: c), await b.connected(to: a))
            return da && dc && ba
        })
        try await d.replica.save(Location(name: "D before its removal"))
        #expect(await eventually { a.names() == ["D before its removal"] && b.names() == a.names() && c.names() == a.names() })

        let started = ContinuousClock.now
        try await a.replica.removeDevice(d.replica.deviceID)
        #expect(await eventually(timeout: .seconds(5)) {
            let (ad, cd) = (await a.connected(to: d), await c.connected(to: d))
            return !ad && !cd
        })
        let dropped = ContinuousClock.now - started
        print("reliability: removal → every member dropped the removed device's sessions in \(Int(dropped.millisecondsDouble)) ms")
        #expect(await eventually { await statusText(d).contains("removed") })
        // D is not sent the removal entry (members refuse it first): a member's refusal says by
        // whom and when, and the status keeps saying so whatever D's sessions do next. (A round
        // planned from A's store in the moment between the removal's commit and the refusal can
        // carry the entry, on a busy machine: then D's own roster says the same.)
        let notice = await d.replica.removal
        #expect(notice?.detail.contains("removed from the group by A at 20") == true, "\(String(describing: notice))")
        #expect(await statusText(d).hasPrefix(notice?.source == .roster ? "this device was removed from the group by A at 20"
                                                                          : "this device was removed from the group, says the peer at 127.0.0.1:"))

        // D writes on; members write on.
        try await d.replica.save(Location(name: "D after its removal"))
        try await a.replica.save(Location(name: "A after the removal"))
        #expect(await eventually { b.names().contains("A after the removal") && c.names().contains("A after the removal") })
        // D keeps redialing A and C (backing off: 5 s, doubling) and is refused each time; give it
        // a round. It says why once per member, not at every attempt.
        let refusedD = { (member: Device) in member.lines.all.filter { $0.contains("closing session: this device was removed") }.count }
        #expect(await eventually(timeout: .seconds(30)) { refusedD(a) >= 2 && refusedD(c) >= 2 })
        let said = d.lines.all.filter { $0.hasPrefix("warning") && $0.contains("peer closed the session (this device was removed") }
        #expect(said.count == 2, "\(said)")
        for member in [a, b, c] {
            #expect(!member.names().contains("D after its removal"))
            #expect(member.names().contains("D before its removal"))  // what it wrote before stays
        }
        #expect(!d.names().contains("A after the removal"))
        #expect(a.replica.roster().isRemoved(d.replica.deviceID))
    }

    @Test("a member whose --peer is a removed device stops dialing it: at once if connected, or while it is away; it says so once")
    func removedPeerNotRedialed() async throws {
        let group = try LocalGroup.make(names: ["A", "D", "E"])
        let devices = try (0..<3).map { i in try Device(level: i == 0 ? .debug : .info) { try Replica.create(at: $0, member: i, of: group, logger: $1) } }
        defer { Task { for device in devices { await device.close() } } }
        let (a, d, e) = (devices[0], devices[1], devices[2])
        // A dials D and E (configured); neither dials A.
        try await d.sync()
        try await e.sync()
        try await a.sync([d, e])
        #expect(await eventually {
            let (ad, ae) = (await a.connected(to: d), await a.connected(to: e))
            return ad && ae
        })
        #expect(await a.replica.syncHealth().limits.dialTargets == 2)
        // E goes away first (A keeps redialing its address); then A removes both.
        await e.replica.stopSync()
        #expect(await eventually { !(await a.connected(to: e)) })
        try await a.replica.removeDevice(d.replica.deviceID)
        try await a.replica.removeDevice(e.replica.deviceID)
        #expect(await eventually { !(await a.connected(to: d)) })
        // Neither address is dialed any more: D's after A refused it on the session A had dialed,
        // E's because a session there had shown E's replica ID, which the roster now says is a
        // removed device's. One line each.
        #expect(await eventually { await a.replica.syncHealth().limits.dialTargets == 0 },
                "\(a.lines.all.filter { $0.contains("dial") || $0.contains("session") || $0.contains("removed") || $0.contains("peer") }.joined(separator: "\n"))")
        await a.replica.addPeer(.loopback(d.port))
        #expect(await a.replica.syncHealth().limits.dialTargets == 0)
        let said = a.lines.all.filter { $0.contains("not dialing a removed device") }
        #expect(said.count == 2, "\(said)")
        #expect(a.lines.all.filter { $0.contains("closing session") && $0.contains(d.replica.deviceID.shortForm) }.count == 1)
    }

    @Test("a device that holds its own removal says so, by whom and when, with sync off and on")
    func ownRosterSaysRemoved() async throws {
        let group = try LocalGroup.make(names: ["A", "B"])
        let devices = try (0..<2).map { i in try Device { try Replica.create(at: $0, member: i, of: group, logger: $1) } }
        defer { Task { for device in devices { await device.close() } } }
        let (a, b) = (devices[0], devices[1])
        #expect(await b.replica.removal == nil)
        // A removes B. Members refuse B before it could receive the entry; here B's store gets it
        // anyway (as a copy of a member's store would have it).
        try await a.replica.removeDevice(b.replica.deviceID)
        let id = try #require(a.replica.roster().devices[b.replica.deviceID]?.removal?.entry)
        let entry = try #require(a.replica.roster().entries[id])
        try b.replica.store.write { $0.write(entry.fields, to: entry.recordKey) }
        let notice = try #require(await b.replica.removal)
        #expect(notice.source == .roster && notice.by == "A" && notice.at != nil)
        #expect(notice.description.hasPrefix("this device was removed from the group by A at 20"), "\(notice)")
        try await b.sync()
        #expect(await b.replica.currentStatus == .error(.removedFromGroup(notice)))
        await b.replica.stopSync()
        #expect(await b.replica.currentStatus == .disabled)
    }

    @Test("a member offline during the removal learns it from the next member it meets, then refuses the removed device and drops its late writes")
    func offlineMemberLearnsTheRemoval() async throws {
        let group = try LocalGroup.make(names: ["A", "B", "D"])
        let devices = try (0..<3).map { i in try Device { try Replica.create(at: $0, member: i, of: group, logger: $1) } }
        defer { Task { for device in devices { await device.close() } } }
        let (a, b, d) = (devices[0], devices[1], devices[2])
        try await a.sync()
        try await d.sync([a])
        #expect(await eventually { await a.connected(to: d) })
        try await a.replica.removeDevice(d.replica.deviceID)
        #expect(await eventually { !(await a.connected(to: d)) })
        // B was offline and never heard: D reaches it, and what D writes now lands on B (the window).
        await d.replica.stopSync()
        try await b.sync()
        try await d.sync([b])
        #expect(await eventually { await b.connected(to: d) })
        try await d.replica.save(Location(name: "D, removed, via an unaware member"))
        #expect(await eventually { b.names() == ["D, removed, via an unaware member"] })
        // B meets A: it learns of the removal, drops D within seconds, and drops D's late write.
        await b.replica.addPeer(.loopback(a.port))
        #expect(await eventually { b.replica.roster().isRemoved(d.replica.deviceID) })
        #expect(await eventually(timeout: .seconds(5)) { !(await b.connected(to: d)) })
        #expect(await eventually { b.names().isEmpty && a.names().isEmpty },
                "a: \(a.names()) b: \(b.names()) — D writes as \(d.replica.replicaID); B's writers \(b.replica.roster().writers); cutoff \(String(describing: b.replica.roster().devices[d.replica.deviceID]?.removal?.dataCutoff)); dots \(b.replica.state.records.records(in: "locations").values.flatMap { $0.fields.values.map(\.dot) })")
        #expect(await eventually { a.replica.state.digest == b.replica.state.digest })
        #expect(!(await b.connected(to: d)))
    }

    @Test("a member cannot add or remove devices; a forged roster entry in a hand-built frame is refused by every node")
    func rosterRights() async throws {
        let admin = try Device { try Replica.create(at: $0, name: "admin", logger: $1) }
        defer { Task { await admin.close() } }
        try await admin.sync()
        var members: [Device] = []
        for name in ["member", "other member"] {
            let code = try await admin.replica.invite(role: .member)
            let member = try Device { try Replica.join(at: $0, name: name, invite: code, logger: $1) }
            try await member.sync([admin])
            members.append(member)
        }
        let all = members
        defer { Task { for member in all { await member.close() } } }
        let (member, other) = (members[0], members[1])
        #expect(await eventually { admin.replica.roster().activeDevices.count == 3 && member.replica.role == .member && other.replica.role == .member })

        // Locally, with a clear error.
        await #expect(throws: ReplicaError.deviceAdministration(.notAdmin(role: "member"))) { try await member.replica.removeDevice(admin.replica.deviceID) }
        await #expect(throws: ReplicaError.deviceAdministration(.notAdmin(role: "member"))) { _ = try await member.replica.invite() }

        // Over the wire: the member signs "add this key as admin" itself, and sends it in a delta.
        let key = try DeviceKey.load(from: member.directory + "/" + Replica.deviceKeyFile)
        let roster = member.replica.roster()
        let evil = DeviceKey.generate()
        var clock = HybridLogicalClock()
        let forged = try RosterEntry.make(.add(device: evil.publicKey, name: "evil", role: .admin),
                                          context: roster.context(for: key.deviceID, at: clock.tick()), signer: key)
        // And one whose signature is broken (a flipped byte in the signature).
        var broken = forged.bytes
        broken[broken.count - 1] ^= 0x01
        let identity = LocalIdentity(key: key, groupID: member.replica.groupID)
        for (bytes, recordID) in [(forged.bytes, forged.id.uuid), (broken, UUID())] {
            for target in [admin, other] {
                // The three may still be converging (each one's own roster entries travel last):
                // take `before` once they agree, so only the forged frame could change it.
                #expect(await eventually { Set([admin, member, other].map { $0.replica.state.digest }).count == 1 })
                let before = target.replica.state.digest
                let replica = ReplicaID.random()
                var map = RecordMap()
                try map.write(["e": .bytes(bytes)], to: RecordKey(collection: RosterEntry.collection, id: recordID),
                              at: HLCTimestamp(physicalMilliseconds: HybridLogicalClock.wallClock(), logical: 0), by: replica)
                let frame = Message.delta(WireDelta.encode(map, with: WireDictionary(startingAt: HybridLogicalClock.wallClock())))
                try await Self.send([frame.encodedFrame()], to: target.port, as: identity)
                #expect(await eventually { target.lines.all.contains { $0.contains("roster entr") && $0.contains("closing session") } })
                #expect(target.replica.state.digest == before)
                #expect(target.replica.roster().devices[evil.deviceID] == nil)
            }
        }
    }

    @Test("a member's self-promotion and a device it adds, in one frame with its claim on a fresh replica ID, are refused as not yet; nothing is stored")
    func selfPromotion() async throws {
        let admin = try Device { try Replica.create(at: $0, name: "admin", logger: $1) }
        defer { Task { await admin.close() } }
        try await admin.sync()
        let code = try await admin.replica.invite(role: .member)
        let member = try Device { try Replica.join(at: $0, name: "member", invite: code, logger: $1) }
        defer { Task { await member.close() } }
        try await member.sync([admin])
        #expect(await eventually { member.replica.role == .member && admin.replica.state.digest == member.replica.state.digest })

        let key = try DeviceKey.load(from: member.directory + "/" + Replica.deviceKeyFile)
        let identity = LocalIdentity(key: key, groupID: member.replica.groupID)
        let roster = member.replica.roster()
        var clock = HybridLogicalClock()
        let fresh = ReplicaID.random()
        let claim = try RosterEntry.make(.writer(fresh), context: roster.context(for: key.deviceID, at: clock.tick()), signer: key)
        let afterClaim = roster.adding([claim])
        let promote = try RosterEntry.make(.add(device: key.publicKey, name: "member", role: .admin),
                                           context: afterClaim.context(for: key.deviceID, at: clock.tick()), signer: key)
        let evil = DeviceKey.generate()
        let addEvil = try RosterEntry.make(.add(device: evil.publicKey, name: "evil", role: .admin),
                                           context: afterClaim.adding([promote]).context(for: key.deviceID, at: clock.tick()), signer: key)
        var map = RecordMap()
        var delta = RecordMap.empty()
        let now = HLCTimestamp(physicalMilliseconds: HybridLogicalClock.wallClock(), logical: 0)
        for entry in [claim, promote, addEvil] { delta.merge(try map.write(entry.fields, to: entry.recordKey, at: now, by: fresh)) }
        let frame = Message.delta(WireDelta.encode(delta, with: WireDictionary(startingAt: HybridLogicalClock.wallClock()))).encodedFrame()

        let before = admin.replica.state.digest
        let reason = try await Self.send([frame], to: admin.port, as: identity,
                                         until: { admin.replica.state.contains(promote.recordKey) })
        #expect(reason == .other)
        #expect(await eventually { admin.lines.all.contains { $0.contains("closing session") && $0.contains("never been an admin") } })
        #expect(admin.replica.state.digest == before)
        for entry in [claim, promote, addEvil] { #expect(!admin.replica.state.contains(entry.recordKey)) }
        #expect(admin.replica.roster().devices[evil.deviceID] == nil)
        #expect(admin.replica.roster().role(of: key.deviceID) == .member)
    }

    @Test("a member's writes under a replica ID no device claims are refused (reason 14, a warning, nothing stored); with a claim in the same frame they land")
    func unclaimedReplica() async throws {
        let admin = try Device { try Replica.create(at: $0, name: "admin", logger: $1) }
        defer { Task { await admin.close() } }
        try await admin.sync()
        let code = try await admin.replica.invite(role: .member)
        let member = try Device { try Replica.join(at: $0, name: "member", invite: code, logger: $1) }
        defer { Task { await member.close() } }
        try await member.sync([admin])
        #expect(await eventually { member.replica.role == .member && admin.replica.state.digest == member.replica.state.digest })

        let key = try DeviceKey.load(from: member.directory + "/" + Replica.deviceKeyFile)
        let identity = LocalIdentity(key: key, groupID: member.replica.groupID)
        var clock = HybridLogicalClock()
        /// A delta writing one location as `replica`, after `entries` (roster records, also as `replica`).
        func frame(by replica: ReplicaID, name: String, entries: [RosterEntry] = []) throws -> [UInt8] {
            var map = RecordMap()
            var delta = RecordMap.empty()
            let now = HLCTimestamp(physicalMilliseconds: HybridLogicalClock.wallClock(), logical: 0)
            for entry in entries { delta.merge(try map.write(entry.fields, to: entry.recordKey, at: now, by: replica)) }
            delta.merge(try map.write(["name": .string(name), "address": .string("")], to: RecordKey(collection: "locations", id: UUID()),
                                      at: now, by: replica))
            return Message.delta(WireDelta.encode(delta, with: WireDictionary(startingAt: HybridLogicalClock.wallClock()))).encodedFrame()
        }

        // Under an ID nobody claims: refused.
        let before = admin.replica.state.digest
        let unclaimed = ReplicaID.random()
        let reason = try await Self.send([try frame(by: unclaimed, name: "anonymous")], to: admin.port, as: identity)
        #expect(reason == .unclaimedReplica)
        #expect(await eventually { admin.lines.all.contains { $0.contains("closing session") && $0.contains(unclaimed.shortDescription) } })
        #expect(admin.replica.state.digest == before)
        #expect(!admin.names().contains("anonymous"))

        // With the member's own signed claim on a fresh ID in the same frame: stored, and the
        // roster says whose writes they are.
        let fresh = ReplicaID.random()
        let claim = try RosterEntry.make(.writer(fresh), context: member.replica.roster().context(for: key.deviceID, at: clock.tick()),
                                         signer: key)
        let accepted = try await Self.send([try frame(by: fresh, name: "claimed", entries: [claim])], to: admin.port, as: identity,
                                           until: { admin.names().contains("claimed") })
        #expect(accepted == nil)
        #expect(admin.names().contains("claimed"))
        #expect(admin.replica.roster().claimant(of: fresh) == key.deviceID)

        // The node still writes and syncs with its members.
        try await admin.replica.save(Location(name: "after"))
        #expect(await eventually { member.names().contains("after") && member.names().contains("claimed") })
        #expect(!member.names().contains("anonymous"))
    }

    /// A member's authenticated session (TLS, hello, auth), then `frames`. Returns the reason of
    /// the error or goodbye that ended it, or nil once `until` holds after the frames were sent
    /// (checked at every frame the receiver sends; its keepalive pings come every second).
    @discardableResult
    static func send(_ frames: [[UInt8]], to port: UInt16, as identity: LocalIdentity,
                     until: (@Sendable () -> Bool)? = nil) async throws -> CloseReason? {
        let tls = try DeviceTLS(key: identity.key) { _ in true }
        let (channel, _) = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(.seconds(3))
            .connect(host: "127.0.0.1", port: Int(port)) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try SyncNode.configurePipeline(channel, tls: tls, dialed: true, maxFrame: WireLimits.defaultMaxFrameBytes)
                }
            }
        return try? await channel.executeThenClose { inbound, outbound -> CloseReason? in
            let nonce = (0..<16).map { _ in UInt8.random(in: 0...255) }
            let me = ReplicaID.random()
            let hello = Hello(replicaID: me, name: "forger", wallClockMilliseconds: HybridLogicalClock.wallClock(),
                              context: CausalContext(), digest: .empty, groupID: identity.groupID.bytes,
                              deviceKey: identity.key.publicKey.x963, nonce: nonce)
            try await outbound.write(ByteBuffer(bytes: Message.hello(hello).encodedFrame()))
            var authenticated = false
            for try await frame in inbound.frames {
                switch try Message.decode(type: frame.type, body: frame.body) {
                case .hello(let theirs):
                    let signature = SessionAuth.sign(key: identity.key, ownNonce: nonce, peerNonce: theirs.nonce ?? [], own: me,
                                                     group: identity.groupID)
                    try await outbound.write(ByteBuffer(bytes: Message.auth(signature: signature).encodedFrame()))
                case .auth where !authenticated:
                    authenticated = true
                    for frame in frames { try await outbound.write(ByteBuffer(bytes: frame)) }
                case .error(let reason, _), .goodbye(let reason, _):
                    return reason
                default:
                    if authenticated, let until, until() { return nil }
                }
            }
            return nil
        }
    }
}
