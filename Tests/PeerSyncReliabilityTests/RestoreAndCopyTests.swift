import Foundation
import Logging
import PeerSync
import PeerSyncTestSupport
import Testing
import ShiftSchedulerModel

/// A store restored from an older backup, or copied to a second machine, must never issue a dot
/// twice, and must lose none of its writes (issue 17).
@Suite("Restored and copied stores", .ownThread, .serialized)
struct RestoreAndCopyTests {
    let copies = StoreCopies(names: ["a", "b"])
    var group: LocalGroup { copies.group }
    func open(_ directory: String, _ name: String, _ lines: RecordingLogHandler.Lines = .init()) throws -> Replica {
        try copies.open(directory, name, lines)
    }
    func sync(_ replica: Replica, peers: [UInt16] = []) async throws -> UInt16 { try await copies.sync(replica, peers: peers) }
    func names(_ replica: Replica) throws -> [String] { try copies.names(replica) }
    func backup(_ directory: String, to copy: String) throws { try copies.backup(directory, to: copy) }
    func restore(_ copy: String, to directory: String, inPlace: Bool) throws { try copies.restore(copy, to: directory, inPlace: inPlace) }

    @Test("restored from a backup, one write offline, then synced: both hold all four records", arguments: [false, true])
    func restore(inPlace: Bool) async throws {
        let (dirA, dirB, saved) = try (makeTemporaryDirectory("restore-a"), makeTemporaryDirectory("restore-b"),
                                       makeTemporaryDirectory("restore-backup"))
        defer { [dirA, dirB, saved].forEach(removeTemporaryDirectory) }
        let lines = RecordingLogHandler.Lines()
        var a: Replica? = try open(dirA, "a", lines)
        let b = try open(dirB, "b")
        let portB = try await sync(b)
        _ = try await sync(a!, peers: [portB])
        try await a!.save(Location(name: "before the backup"))
        #expect(await eventually { (try? names(b)) == ["before the backup"] })
        await a!.stopSync()
        a = nil
        try backup(dirA, to: saved)
        // Three writes after the backup, synced to b.
        a = try open(dirA, "a", lines)
        _ = try await sync(a!, peers: [portB])
        for name in ["one", "two", "three"] { try await a!.save(Location(name: name)) }
        #expect(await eventually { (try? names(b).count) == 4 })
        await a!.stopSync()
        a = nil
        // The backup is put back; one write is made before meeting a peer.
        try restore(saved, to: dirA, inPlace: inPlace)
        a = try open(dirA, "a", lines)
        #expect(try names(a!) == ["before the backup"])
        try await a!.save(Location(name: "offline after the restore"))
        _ = try await sync(a!, peers: [portB])
        let all = ["before the backup", "offline after the restore", "one", "three", "two"]
        #expect(await eventually {
            (try? names(a!)) == all && (try? names(b)) == all && a!.state.digest == b.state.digest
        }, "a: \((try? names(a!)) ?? []) b: \((try? names(b)) ?? []) log: \(lines.all.filter { $0.contains("warning") })")
        // The same file overwritten: only the peer can tell. A new file: the store sees it at open,
        // unless the file system gave the new file the old one's inode — then the peer tells it.
        let byPeer = lines.all.contains { $0.contains("restored from an older copy; continuing as a new replica") }
        let atOpen = lines.all.contains { $0.contains("this store was copied or restored") }
        #expect(inPlace ? byPeer : (byPeer || atOpen), "\(lines.all.filter { $0.contains("warning") })")
        #expect(try a!.store.incarnations().count >= 2)
        await a!.stopSync()
        await b.stopSync()
    }

    @Test("an admin restored from a backup taken before it admitted a device admits it again; both converge with every write",
          arguments: [false, true])
    func restoredAdmin(inPlace: Bool) async throws {
        let (dirA, dirB, saved) = try (makeTemporaryDirectory("restored-admin-a"), makeTemporaryDirectory("restored-admin-b"),
                                       makeTemporaryDirectory("restored-admin-backup"))
        defer { [dirA, dirB, saved].forEach(removeTemporaryDirectory) }
        let lines = RecordingLogHandler.Lines()
        // The first phone makes the group and an invite; its store is backed up before the
        // second phone joins.
        var a: Replica? = try Replica.create(at: dirA, name: "first phone", logger: RecordingLogHandler.logger("a", into: lines))
        let code = try await a!.invite()
        a = nil
        try backup(dirA, to: saved)
        let b = try Replica.join(at: dirB, name: "second phone", invite: code, logger: RecordingLogHandler.logger("b", into: lines))
        try await b.save(Location(name: "written by the second phone"))
        let portB = try await sync(b)
        a = try Replica.open(at: dirA, logger: RecordingLogHandler.logger("a", into: lines))
        _ = try await sync(a!, peers: [portB])
        #expect(await eventually { (try? names(a!)) == ["written by the second phone"] && a!.roster().isActive(b.deviceID) })
        await a!.stopSync()
        a = nil

        // The backup comes back; one write before meeting the second phone, which it never saw.
        try restore(saved, to: dirA, inPlace: inPlace)
        a = try Replica.open(at: dirA, logger: RecordingLogHandler.logger("a", into: lines))
        #expect(a!.roster().devices[b.deviceID] == nil)
        try await a!.save(Location(name: "written offline on the restored phone"))
        _ = try await sync(a!, peers: [portB])
        // The second phone is admitted and its write reaches the restored phone.
        #expect(await eventually {
            (try? names(a!).contains("written by the second phone")) == true && a!.roster().isActive(b.deviceID)
        }, "a: \((try? names(a!)) ?? []) log: \(lines.all.filter { $0.contains("warning") })")
        #expect(lines.all.contains { $0.contains("admitting a device") && $0.contains("admitted.by=entries signed by admins") },
                "\(lines.all.filter { $0.contains("admitting") })")
        #expect(!lines.all.contains { $0.contains("data before admission") })
        if inPlace {
            // Caught by the peer before the admission is written (PROTOCOL.md §6.4, §6.9).
            #expect(lines.all.contains { $0.contains("restored from an older copy; continuing as a new replica") })
        }
        let all = ["written by the second phone", "written offline on the restored phone"]
        func converged(within timeout: Duration = .seconds(60)) async -> Bool {
            await eventually(timeout: timeout) { (try? names(a!)) == all && (try? names(b)) == all && a!.state.digest == b.state.digest }
        }
        // In place, the offline write took a counter the second phone already holds for another
        // write: it moves to the new incarnation when the restore is found (PROTOCOL §6.9).
        #expect(await converged(), "a: \((try? names(a!)) ?? []) b: \((try? names(b)) ?? []) log: \(lines.all.filter { $0.contains("warning") })")
        // Writes after the reunion travel both ways.
        try await b.save(Location(name: "after the reunion"))
        #expect(await eventually { (try? names(a!).contains("after the reunion")) == true })
        await a!.stopSync()
        await b.stopSync()
    }

    @Test("a device admitted without a confirmation (an earlier version) gets one from its inviter once they meet, and no warning")
    func confirmationPass() async throws {
        let (dirA, dirB) = try (makeTemporaryDirectory("confirm-a"), makeTemporaryDirectory("confirm-b"))
        defer { [dirA, dirB].forEach(removeTemporaryDirectory) }
        let lines = RecordingLogHandler.Lines()
        let a = try Replica.create(at: dirA, name: "first phone", logger: RecordingLogHandler.logger("a", into: lines))
        let b = try Replica.join(at: dirB, name: "second phone", invite: try await a.invite(), logger: RecordingLogHandler.logger("b", into: lines))
        // As the previous version admitted it: the enrol alone.
        let enrol = try #require(b.roster().entries.values.first { $0.kind == .enrol })
        try await a.commit { $0.write(enrol.fields, to: enrol.recordKey) }
        #expect(a.roster().isActive(b.deviceID))
        #expect(a.roster().admissionProof(of: b.deviceID)?.first?.kind == .enrol)
        let portB = try await sync(b)
        _ = try await sync(a, peers: [portB])
        #expect(await eventually {
            b.roster().admissionProof(of: b.deviceID)?.map(\.kind) == [.add, .genesis, .invite, .enrol]
                && a.roster().entries.count == b.roster().entries.count
        }, "\(b.roster().admissionProof(of: b.deviceID) ?? [])")
        let adds = a.roster().entries.values.filter { $0.kind == .add }
        #expect(adds.count == 1 && adds.first?.signer == a.deviceID)
        #expect(a.roster().devices[b.deviceID]?.origin != .added)  // the enrol still admits it
        #expect(!lines.all.contains { $0.contains("has no effect") }, "\(lines.all.filter { $0.contains("has no effect") })")
        await a.stopSync()
        await b.stopSync()
    }

    @Test("a store copied to a third machine: each copy writes, all three run, all converge with every write, no reconnect storm")
    func copy() async throws {
        let (dirA, dirB, dirC) = try (makeTemporaryDirectory("copy-a"), makeTemporaryDirectory("copy-b"), makeTemporaryDirectory("copy-c"))
        defer { [dirA, dirB, dirC].forEach(removeTemporaryDirectory) }
        let lines = RecordingLogHandler.Lines()
        var a: Replica? = try open(dirA, "a", lines)
        try await a!.save(Location(name: "shared"))
        a = nil
        try backup(dirA, to: dirC)  // the copy: "moving to a new phone while the old one stays in use"
        a = try open(dirA, "a", lines)
        let c = try open(dirC, "a", lines)  // the same device, a second copy of its store
        let b = try open(dirB, "b", lines)
        #expect(c.replicaID != a!.replicaID)
        #expect(c.store.incarnationChange != nil)
        try await a!.save(Location(name: "written on the original"))
        try await c.save(Location(name: "written on the copy"))
        let portB = try await sync(b)
        let portA = try await sync(a!, peers: [portB])
        _ = try await sync(c, peers: [portB, portA])
        let all = ["shared", "written on the copy", "written on the original"]
        #expect(await eventually {
            (try? names(a!)) == all && (try? names(b)) == all && (try? names(c)) == all
                && a!.state.digest == b.state.digest && b.state.digest == c.state.digest
        })
        #expect(await eventually {
            let (pa, pb, pc) = (await a!.peers(), await b.peers(), await c.peers())
            return pa.count == 2 && pb.count == 2 && pc.count == 2
        })
        #expect(lines.all.filter { $0.contains("duplicate") }.count <= 1, "\(lines.all.filter { $0.contains("duplicate") })")
        for replica in [a!, b, c] { await replica.stopSync() }
    }
}
