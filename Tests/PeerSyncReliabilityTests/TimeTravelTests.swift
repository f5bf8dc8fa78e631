import Foundation
import Logging
import PeerSync
import PeerSyncTestSupport
import Testing
import ShiftSchedulerModel

/// A device that comes back from the past — a backup put back as new files or over the old ones
/// in place — converges with the group: nothing the group purged comes back, and every write it
/// made since the restore is kept (issue 29, failures 1 and 3). Real TLS, real SQLite files.
@Suite("Time travel", .ownThread, .serialized)
struct TimeTravelTests {
    let copies = StoreCopies(names: ["a", "b"])
    func open(_ directory: String, _ name: String, _ lines: RecordingLogHandler.Lines = .init()) throws -> Replica {
        try copies.open(directory, name, lines)
    }
    func sync(_ replica: Replica, peers: [UInt16] = []) async throws -> UInt16 { try await copies.sync(replica, peers: peers) }
    func names(_ replica: Replica) throws -> [String] { try copies.names(replica) }
    func close(_ replica: inout Replica?) async { await copies.close(&replica) }

    /// Both replicas purged at least `count` deleted records (automatic compaction).
    func purged(_ replicas: Replica..., atLeast count: Int) async -> Bool {
        await eventually(timeout: .seconds(60)) {
            replicas.allSatisfy { $0.compactionStatus().purgedRecords >= count }
        }
    }

    /// a in `dirA` listening, b in `dirB` dialing it (held only by the caller's `b`, which
    /// releases it to put a backup back).
    func pair(_ dirA: String, _ dirB: String, _ lines: RecordingLogHandler.Lines, b: inout Replica?) async throws -> (Replica, UInt16) {
        let a = try open(dirA, "a", lines)
        b = try open(dirB, "b", lines)
        let portA = try await sync(a)
        _ = try await sync(b!, peers: [portA])
        return (a, portA)
    }

    @Test("a member put back from a backup older than a delete and its purge: the record stays deleted, no repair",
          arguments: [false, true])
    func restoredMemberDoesNotResurrect(inPlace: Bool) async throws {
        let (dirA, dirB, saved) = try (makeTemporaryDirectory("tt-a"), makeTemporaryDirectory("tt-b"), makeTemporaryDirectory("tt-backup"))
        defer { [dirA, dirB, saved].forEach(removeTemporaryDirectory) }
        let lines = RecordingLogHandler.Lines()
        var b: Replica?
        let (a, portA) = try await pair(dirA, dirB, lines, b: &b)
        let x = Location(name: "X")
        try await a.save(x)
        try await a.save(Location(name: "Y"))
        #expect(await eventually { (try? names(b!)) == ["X", "Y"] })
        await close(&b)
        try copies.backup(dirB, to: saved)
        b = try open(dirB, "b", lines)
        _ = try await sync(b!, peers: [portA])
        try await a.delete(Location.self, id: x.id)
        #expect(await purged(a, b!, atLeast: 1), "a: \(a.compactionStatus().summary()) b: \(b!.compactionStatus().summary())")
        await close(&b)
        // The backup, from before the delete, is put back.
        try copies.restore(saved, to: dirB, inPlace: inPlace)
        b = try open(dirB, "b", lines)
        #expect(try names(b!) == ["X", "Y"])
        _ = try await sync(b!, peers: [portA])
        #expect(await eventually(timeout: .seconds(30)) {
            (try? names(b!)) == ["Y"] && (try? names(a)) == ["Y"] && a.state.digest == b!.state.digest
        }, "a: \((try? names(a)) ?? []) b: \((try? names(b!)) ?? []) log: \(lines.all.filter { $0.contains("warning") }.suffix(10))")
        let (repairsA, repairsB) = (await a.syncHealth().repairs, await b!.syncHealth().repairs)
        #expect(repairsA == 0 && repairsB == 0, "\(lines.all.filter { $0.contains("repair") })")
        await b!.stopSync()
        await a.stopSync()
    }

    @Test("put back in place, a write offline, the lost future's record under the same counter deleted and purged before the first session: the offline write reaches both")
    func inPlaceRestoreKeepsTheOfflineWrite() async throws {
        let (dirA, dirB, saved) = try (makeTemporaryDirectory("tt2-a"), makeTemporaryDirectory("tt2-b"), makeTemporaryDirectory("tt2-backup"))
        defer { [dirA, dirB, saved].forEach(removeTemporaryDirectory) }
        let lines = RecordingLogHandler.Lines()
        var b: Replica?
        let (a, portA) = try await pair(dirA, dirB, lines, b: &b)
        try await a.save(Location(name: "shared"))
        #expect(await eventually { (try? names(b!)) == ["shared"] })
        await close(&b)
        try copies.backup(dirB, to: saved)
        // b's lost future: one write, synced; a deletes it; both purge it.
        b = try open(dirB, "b", lines)
        _ = try await sync(b!, peers: [portA])
        let lost = Location(name: "written by the lost future")
        try await b!.save(lost)
        #expect(await eventually { (try? names(a)) == ["shared", "written by the lost future"] })
        try await a.delete(Location.self, id: lost.id)
        #expect(await purged(a, b!, atLeast: 1), "a: \(a.compactionStatus().summary()) b: \(b!.compactionStatus().summary())")
        await close(&b)
        // Put back over the same files; one write offline, under the counter the lost future used.
        try copies.restore(saved, to: dirB, inPlace: true)
        b = try open(dirB, "b", lines)
        try await b!.save(Location(name: "offline after the restore"))
        _ = try await sync(b!, peers: [portA])
        let expected = ["offline after the restore", "shared"]
        #expect(await eventually(timeout: .seconds(30)) {
            (try? names(b!)) == expected && (try? names(a)) == expected && a.state.digest == b!.state.digest
        }, "a: \((try? names(a)) ?? []) b: \((try? names(b!)) ?? []) log: \(lines.all.filter { !$0.contains("debug") }.joined(separator: "\n"))")
        await b!.stopSync()
        await a.stopSync()
    }
}
