import Foundation
@testable import PeerSync
import PeerSyncIdentity
import PeerSyncTestSupport
import Testing

/// Admins and recovery (issue 31): promote and demote, the single-admin warning, and a lost
/// last admin recovered with the code made when the group was.
@Suite("Admins and recovery", .timeLimit(.minutes(8)))
struct AdminTests {
    private func syncAll(_ replicas: [Replica]) async throws {
        let port = try await replicas[0].startSync(SyncConfiguration(security: .tls, listen: .loopback(0)))
        for replica in replicas.dropFirst() {
            try await replica.startSync(SyncConfiguration(security: .tls, listen: nil, peers: [.loopback(port)]))
        }
    }

    @Test func promoteDemoteAndTheSingleAdminWarning() async throws {
        let directories = try (0..<2).map { _ in try makeTemporaryDirectory("peersync-admin") }
        defer { for directory in directories { removeTemporaryDirectory(directory) } }
        let office = try Replica.create(at: directories[0], name: "office", logger: testLogger("office"))
        #expect(office.adminWarning?.contains("office is the only admin device") == true)
        let tablet = try Replica.join(at: directories[1], name: "tablet", invite: try await office.invite(), logger: testLogger("tablet"))
        try await syncAll([office, tablet])
        #expect(await eventually { tablet.roster().isActive(tablet.deviceID) })

        // A member cannot promote; the admin can, and the warning goes.
        await #expect(throws: ReplicaError.self) { try await tablet.setRole(tablet.deviceID, to: .admin) }
        try await office.setRole(tablet.deviceID, to: .admin)
        #expect(office.adminWarning == nil)
        #expect(await eventually { tablet.role == .admin })
        // The tablet, now an admin, demotes the office; demoting the last admin is refused.
        try await tablet.setRole(office.deviceID, to: .member)
        #expect(await eventually { office.role == .member })
        do {
            try await tablet.setRole(tablet.deviceID, to: .member)
            Issue.record("demoting the last admin was not refused")
        } catch {
            #expect("\(error)".contains("only admin device"), "\(error)")
        }
        #expect(tablet.role == .admin)
        for replica in [office, tablet] { await replica.close() }
    }

    @Test func aLostLastAdminIsRecoveredWithTheRecoveryCode() async throws {
        let directories = try (0..<3).map { _ in try makeTemporaryDirectory("peersync-admin") }
        defer { for directory in directories { removeTemporaryDirectory(directory) } }
        let office = try Replica.create(at: directories[0], name: "office", logger: testLogger("office"))
        let code = try await office.makeRecoveryCode()
        #expect(code.hasPrefix("PSR-"))
        #expect(office.roster().recoveryKeys.count == 1)
        #expect(office.adminWarning?.contains("recovery code") == true)
        try await office.save(PlannedShift(title: "Night", assignee: "", note: ""))
        let tablet = try Replica.join(at: directories[1], name: "tablet", invite: try await office.invite(), logger: testLogger("tablet"))
        try await syncAll([office, tablet])
        #expect(await eventually { tablet.roster().isActive(tablet.deviceID) && tablet.roster().recoveryKeys.count == 1 })
        // The office — the only admin — is lost.
        await office.close()
        await tablet.stopSync()

        // A typo is refused with one line, nothing created.
        let typo = String(code.dropLast()) + (code.hasSuffix("0") ? "1" : "0")
        do {
            _ = try Replica.recover(at: directories[2], name: "new phone", recoveryCode: typo)
            Issue.record("a mistyped code was accepted")
        } catch {
            #expect("\(error)".contains("check character"), "\(error)")
        }
        #expect(!FileManager.default.fileExists(atPath: directories[2] + "/replica.sqlite"))

        let phone = try Replica.recover(at: directories[2], name: "new phone", recoveryCode: code, logger: testLogger("phone"))
        try await syncAll([tablet, phone])
        let recovered = await eventually(timeout: .seconds(120)) { phone.role == .admin && tablet.roster().role(of: phone.deviceID) == .admin }
        #expect(recovered, "the phone is \(String(describing: phone.role)) here, \(String(describing: tablet.roster().role(of: phone.deviceID))) on the tablet")
        #expect(await eventually { (try? phone.fetchAll(PlannedShift.self).count) == 1 })
        // The new admin administers: it removes the lost office and makes a new code.
        try await phone.removeDevice(office.deviceID)
        #expect(await eventually { tablet.roster().isRemoved(office.deviceID) })
        let newCode = try await phone.makeRecoveryCode()
        #expect(newCode != code)
        #expect(phone.roster().recoveryKeys.count == 1)
        // A recovery key never holds a session.
        let recoveryKey = try #require(phone.roster().recoveryKeys.first)
        #expect(!tablet.roster().deviceAdmins.contains { $0.id == recoveryKey.id })
        for replica in [tablet, phone] { await replica.close() }
    }
}
