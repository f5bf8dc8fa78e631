import Foundation
import ShiftSchedulerModel
@testable import PeerSync
import PeerSyncAppTestSupport
import PeerSyncTestSupport
import Testing

/// Replicas held in memory only (SwiftUI previews, app tests): the same API, no file.
@Suite("In-memory replicas", .timeLimit(.minutes(6)))
struct InMemoryReplicaTests {
    /// What shows that a replica wrote nothing anywhere: no directory, SQLite in memory, and
    /// the temporary directory for attachment bytes never made.
    func expectNoFiles(_ replica: Replica, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(replica.isInMemory && replica.directory.isEmpty, sourceLocation: sourceLocation)
        #expect(replica.store.directory == nil && replica.store.path == "in-memory store", sourceLocation: sourceLocation)
        #expect(!FileManager.default.fileExists(atPath: replica.store.filesDirectory), sourceLocation: sourceLocation)
    }

    /// Stops sync on each replica, then checks it left no file.
    func stopExpectingNoFiles(_ replicas: Replica..., sourceLocation: SourceLocation = #_sourceLocation) async {
        for replica in replicas {
            await replica.stopSync()
            expectNoFiles(replica, sourceLocation: sourceLocation)
        }
    }

    @Test("saves, fetches, batches, live queries and changes() work in memory, and nothing is written to disk")
    func savesAndFetches() async throws {
        let replica = try Replica.inMemory(name: "Preview", logger: testLogger("preview"))
        #expect(replica.role == .admin && replica.state.name == "Preview")
        let changes = replica.changes()
        let long = Recorder(replica.observe(ShiftType.self, where: { $0.duration >= 9 * 3600 }))
        #expect(await long.wait(count: 1))

        let night = ShiftType(symbol: "N", title: "Night", duration: 10 * 3600)
        try await replica.save(night)
        #expect(try replica.fetch(ShiftType.self, id: night.id) == night)
        var iterator = changes.makeAsyncIterator()
        let change = await iterator.next()
        #expect(change?.origin == .local && change?.records.contains(RecordKey(collection: ShiftType.collection, id: night.id)) == true)
        #expect(await long.wait(count: 2))
        #expect(long.last.map(titles) == ["Night"])

        let written = try await replica.batch { batch in
            try batch.save(Location(name: "Ward 3"))
            try batch.save(ShiftType(symbol: "L", title: "Late", duration: 9 * 3600))
            return batch.changeCount
        }
        #expect(written == 2)
        #expect(try replica.fetchAll(Location.self).map(\.name) == ["Ward 3"])
        #expect(await long.wait { $0.count == 2 })
        #expect(try await replica.delete(ShiftType.self, id: night.id))
        #expect(try replica.fetch(ShiftType.self, id: night.id) == nil)
        try await replica.setSetting(SettingKey.weekStart, to: 1, scope: .synced)
        #expect(replica.setting(SettingKey.weekStart, scope: .synced) == 1)
        long.stop()
        expectNoFiles(replica)
    }

    @Test("one replica creates a group, another joins with an invite, and they sync over an app's pipe, all in memory")
    func joinAndSyncOverPipe() async throws {
        let a = try Replica.inMemory(name: "a", logger: testLogger("mem-a"))
        let b = try Replica.inMemory(name: "b", invite: try await a.invite(), logger: testLogger("mem-b"))
        let pending = await b.pendingJoin
        #expect(pending != nil && b.role == nil)
        for i in 0..<50 { try await a.save(Location(name: "from a \(i)")) }
        try await b.save(ShiftType(symbol: "N", title: "Night", duration: 36_000))

        let pipe = PipeLink(a, b)
        #expect(await eventually { a.state.digest == b.state.digest })
        #expect(await eventually { await b.pendingJoin == nil }, "the join completed over the session")
        #expect(b.role == .member && a.roster().isActive(b.deviceID))

        // Live changes flow both ways.
        try await a.save(Location(name: "live from a"))
        try await b.delete(ShiftType.self, id: try #require(b.fetchAll(ShiftType.self).first).id)
        #expect(await eventually { a.state.digest == b.state.digest && (try? a.fetchAll(ShiftType.self).isEmpty) == true })
        #expect(try b.fetchAll(Location.self).count == 51)
        await pipe.close()
        await stopExpectingNoFiles(a, b)
    }

    @Test("two in-memory devices of a local group sync over TCP")
    func syncOverTCP() async throws {
        let group = try LocalGroup.make(names: ["tcp-a", "tcp-b"])
        let a = try Replica.inMemory(member: 0, of: group, logger: testLogger("tcp-a"))
        let b = try Replica.inMemory(member: 1, of: group, logger: testLogger("tcp-b"))
        try await a.save(Location(name: "Ward 3"))
        try await connect(a, b)
        try await b.save(Location(name: "Ward 4"))
        #expect(await eventually { a.state.digest == b.state.digest && (try? a.fetchAll(Location.self).count) == 2 })
        await stopExpectingNoFiles(a, b)
    }

    @Test("attachments work in memory: their bytes go to a temporary directory of the store")
    func attachments() async throws {
        let replica = try Replica.inMemory(name: "pictures", logger: testLogger("pictures"))
        let attachment = try await replica.addAttachment(Data("jpeg".utf8), mediaType: "image/jpeg")
        #expect(try await replica.attachmentData(for: attachment) == Data("jpeg".utf8))
        let url = try #require(replica.attachmentURL(for: attachment))
        #expect(url.path.hasPrefix(replica.store.filesDirectory))
        #expect(replica.store.filesDirectory.contains("peersync-files-"))
    }

    @Test("a device number outside the local group is one clear error")
    func badMember() throws {
        let group = try LocalGroup.make(names: ["only"])
        #expect(throws: DeviceAdministrationError.invalidEntry("no device 1 in a local group of 1")) {
            try Replica.inMemory(member: 1, of: group)
        }
    }
}
