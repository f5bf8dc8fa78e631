import Foundation
@testable import PeerSync
import PeerSyncStore
import PeerSyncTestSupport
import Testing

/// A device used alone first joins a team with its data, or leaves one with it (issue 31).
@Suite("Joining a team with the data you have", .timeLimit(.minutes(8)))
struct TeamJoinTests {
    private func shifts(_ prefix: String, _ count: Int) -> [PlannedShift] {
        (0..<count).map { PlannedShift(title: "\(prefix) \($0)", assignee: prefix, note: "") }
    }

    /// Starts sync on every replica: the first listens, the others dial it.
    private func syncAll(_ replicas: [Replica]) async throws {
        let port = try await replicas[0].startSync(SyncConfiguration(security: .tls, listen: .loopback(0)))
        for replica in replicas.dropFirst() {
            try await replica.startSync(SyncConfiguration(security: .tls, listen: nil, peers: [.loopback(port)]))
        }
    }

    private func count(_ replica: Replica) -> Int { (try? replica.fetchAll(PlannedShift.self).count) ?? -1 }

    @Test func joiningFromAStoreWithItsOwnRecordsEndsWithBothSetsEverywhere() async throws {
        let directories = try (0..<3).map { _ in try makeTemporaryDirectory("peersync-team") }
        defer { for directory in directories { removeTemporaryDirectory(directory) } }
        let office = try Replica.create(at: directories[0], name: "office", logger: testLogger("office"))
        for shift in shifts("team", 100) { try await office.save(shift) }
        let tablet = try Replica.join(at: directories[1], name: "ward tablet", invite: try await office.invite(), logger: testLogger("tablet"))

        // Anna used the app alone first: her own group, her own 100 records and a setting.
        var anna = try Replica.create(at: directories[2], name: "Anna's iPad", logger: testLogger("anna"))
        let annasGroup = anna.roster().groupName
        for shift in shifts("anna", 100) { try await anna.save(shift) }
        try await anna.setSetting("theme", to: "dark", scope: .local)
        await anna.close()
        anna = try Replica.join(at: directories[2], name: "Anna's iPad", invite: try await office.invite(), logger: testLogger("anna"))
        // Her data is there at once, offline; the join completes at the first session.
        #expect(count(anna) == 100)
        #expect(anna.setting("theme", scope: .local) == "dark")
        #expect(anna.roster().groupName != annasGroup)

        try await syncAll([office, tablet, anna])
        let converged = await eventually(timeout: .seconds(120)) { [office, tablet, anna].allSatisfy { count($0) == 200 } }
        #expect(converged, "office \(count(office)), tablet \(count(tablet)), anna \(count(anna))")
        #expect(await eventually { anna.roster().isActive(anna.deviceID) })
        // Her records are hers in the team: the same IDs, her values.
        let first = try #require(shifts("anna", 1).first)
        #expect(try office.fetchAll(PlannedShift.self).contains { $0.title == first.title && $0.assignee == "anna" })
        for replica in [office, tablet, anna] { await replica.close() }
    }

    @Test func joiningWithoutTheDataStartsFromTheTeams() async throws {
        let directories = try (0..<2).map { _ in try makeTemporaryDirectory("peersync-team") }
        defer { for directory in directories { removeTemporaryDirectory(directory) } }
        let office = try Replica.create(at: directories[0], name: "office", logger: testLogger("office"))
        for shift in shifts("team", 10) { try await office.save(shift) }
        var ben = try Replica.create(at: directories[1], name: "Ben", logger: testLogger("ben"))
        for shift in shifts("ben", 5) { try await ben.save(shift) }
        await ben.close()
        ben = try Replica.join(at: directories[1], name: "Ben", invite: try await office.invite(), keepingData: false,
                               logger: testLogger("ben"))
        #expect(count(ben) == 0)
        try await syncAll([office, ben])
        #expect(await eventually { count(ben) == 10 })
        #expect(count(office) == 10)
        for replica in [office, ben] { await replica.close() }
    }

    @Test func leavingKeepsTheDataInAGroupOfItsOwn() async throws {
        let directories = try (0..<2).map { _ in try makeTemporaryDirectory("peersync-team") }
        defer { for directory in directories { removeTemporaryDirectory(directory) } }
        let office = try Replica.create(at: directories[0], name: "office", logger: testLogger("office"))
        for shift in shifts("team", 10) { try await office.save(shift) }
        var carla = try Replica.join(at: directories[1], name: "Carla", invite: try await office.invite(), logger: testLogger("carla"))
        try await syncAll([office, carla])
        #expect(await eventually { count(carla) == 10 && carla.roster().isActive(carla.deviceID) })
        await carla.close()
        await office.stopSync()

        carla = try Replica.leaveGroup(at: directories[1], logger: testLogger("carla"))
        #expect(count(carla) == 10)
        let roster = carla.roster()
        #expect(roster.activeDevices.map(\.id) == [carla.deviceID])
        #expect(roster.role(of: carla.deviceID) == .admin)
        // New records go on as usual, in the new group.
        try await carla.save(PlannedShift(title: "mine", assignee: "Carla", note: ""))
        #expect(count(carla) == 11)
        for replica in [office, carla] { await replica.close() }
    }

    @Test func aMoveInterruptedBetweenItsTwoRenamesIsFinishedAtOpen() async throws {
        let directory = try makeTemporaryDirectory("peersync-team")
        defer { removeTemporaryDirectory(directory) }
        let solo = try Replica.create(at: directory, name: "solo", logger: testLogger("solo"))
        try await solo.save(PlannedShift(title: "kept", assignee: "", note: ""))
        await solo.close()
        // Build the new group's store, then crash after the first rename (simulated).
        let moved = try Replica.leaveGroup(at: directory, logger: testLogger("solo"))
        await moved.close()
        let (staging, retired) = Replica.rehomePaths(directory)
        try FileManager.default.moveItem(atPath: directory, toPath: staging)
        try FileManager.default.createDirectory(atPath: retired, withIntermediateDirectories: true)
        let reopened = try Replica.open(at: directory, logger: testLogger("solo"))
        #expect(try reopened.fetchAll(PlannedShift.self).map(\.title) == ["kept"])
        #expect(!FileManager.default.fileExists(atPath: staging) && !FileManager.default.fileExists(atPath: retired))
        await reopened.close()
    }
}
