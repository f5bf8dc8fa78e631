import Foundation
@testable import PeerSync
import PeerSyncModel
import PeerSyncTestSupport
import Testing
import ShiftSchedulerModel

/// Compaction over real TCP on 127.0.0.1 with real SQLite files: records deleted everywhere go
/// away by themselves once every current device has seen the deletion (issue 13).
@Suite("Compaction over sync")
struct CompactionSyncTests {
    /// `count` shift types in one transaction.
    func create(_ replica: Replica, count: Int, label: String) async throws -> [UUID] {
        var ids: [UUID] = []
        try await replica.commit { state in
            var delta = RecordMap.empty()
            for i in 0..<count {
                let shift = ShiftType(symbol: "S\(i % 100)", title: "\(label) \(i)", description: String(repeating: "d", count: 80),
                                      duration: 3600, locationID: nil)
                ids.append(shift.id)
                if let d = try state.save(shift) { delta.merge(d) }
            }
            return delta
        }
        return ids
    }

    func deleteAll(_ replica: Replica) async throws {
        try await replica.commit { state in
            var delta = RecordMap.empty()
            for shift in try state.fetchAll(ShiftType.self) {
                if let d = state.delete(ShiftType.self, id: shift.id) { delta.merge(d) }
            }
            return delta
        }
    }

    /// Starts `replicas[0]` listening and the others dialing it; waits until all are connected.
    @discardableResult
    func star(_ replicas: [Replica]) async throws -> UInt16 {
        let port = try await replicas[0].startSync(SyncConfiguration(security: .tls, listen: .loopback(0)))
        for replica in replicas.dropFirst() {
            try await replica.startSync(SyncConfiguration(security: .tls, listen: .loopback(0), peers: [.loopback(port)]))
        }
        let connected = await eventually { await replicas[0].peers().count == replicas.count - 1 }
        try #require(connected, "the replicas did not connect")
        return port
    }

    func make(_ group: LocalGroup, _ member: Int) throws -> (Replica, String) {
        let directory = try makeTemporaryDirectory("peersync-compaction")
        return (try Replica.create(at: directory, member: member, of: group, logger: testLogger(group.names[member])), directory)
    }

    @Test("three devices create 2,000 records and delete them all: compaction runs by itself and leaves each store and state within 10 % of an empty replica's")
    func threeDevicesDeleteEverything() async throws {
        let group = try LocalGroup.make(names: ["a", "b", "c"])
        let made = try (0..<3).map { try make(group, $0) }
        let replicas = made.map(\.0)
        defer { Task { for (replica, directory) in made { await replica.stopSync(); removeTemporaryDirectory(directory) } } }
        try await star(replicas)
        // The empty replica: the group's roster and nothing else, converged.
        #expect(await eventually { Set(replicas.map { $0.state.digest }).count == 1 })
        for replica in replicas { try replica.store.returnFreeSpace() }
        let emptyBytes = replicas.map { $0.store.bytesOnDisk() }
        let emptyState = replicas.map { $0.state.records.encoded().count }

        for (i, replica) in replicas.enumerated() { _ = try await create(replica, count: 667, label: "r\(i)") }
        #expect(await eventually(timeout: .seconds(120)) { replicas.allSatisfy { (try? $0.fetchAll(ShiftType.self).count) == 2_001 } })
        for replica in replicas { try await deleteAll(replica) }
        let purged = await eventually(timeout: .seconds(120)) {
            replicas.allSatisfy { $0.state.records.invisibleRecordCount == 0 && (try? $0.fetchAll(ShiftType.self).isEmpty) == true }
        }
        #expect(purged, "held: \(replicas.map { $0.state.records.invisibleRecordCount }); \(replicas.map { $0.compactionStatus().summary() })")
        #expect(await eventually { Set(replicas.map { $0.state.digest }).count == 1 })
        // Sessions stopped first, as the benchmark does: a checkpoint cannot truncate the WAL
        // under a running reader (1 run in 5 measured a 650 KB WAL beside a 60 KB store).
        for replica in replicas { await replica.stopSync() }
        for (i, replica) in replicas.enumerated() {
            try replica.store.returnFreeSpace()
            let bytes = replica.store.bytesOnDisk()
            let state = replica.state.records.encoded().count
            #expect(bytes <= emptyBytes[i] + emptyBytes[i] / 10, "store \(i): \(bytes) B, empty \(emptyBytes[i]) B")
            #expect(state <= emptyState[i] + emptyState[i] / 10, "state \(i): \(state) B, empty \(emptyState[i]) B")
            #expect(replica.compactionStatus().heldBackBy.isEmpty)
        }
    }

    @Test("a device offline throughout holds compaction back and status names it; once it returns and catches up, compaction proceeds")
    func offlineDeviceHoldsBackUntilItReturns() async throws {
        let group = try LocalGroup.make(names: ["a", "b", "tablet"])
        let made = try (0..<3).map { try make(group, $0) }
        defer { Task { for (replica, directory) in made { await replica.stopSync(); removeTemporaryDirectory(directory) } } }
        let (a, b, tablet) = (made[0].0, made[1].0, made[2].0)
        let port = try await star([a, b])
        _ = try await create(a, count: 100, label: "a")
        #expect(await eventually { (try? b.fetchAll(ShiftType.self).count) == 100 })
        try await deleteAll(b)
        #expect(await eventually { (try? a.fetchAll(ShiftType.self).isEmpty) == true })
        // Once a has b's report, only the tablet (never seen) holds the deletions back.
        #expect(await eventually { a.compactionStatus().heldBackBy.map(\.name) == ["tablet"] })
        _ = try await a.compact()
        let status = a.compactionStatus()
        #expect(status.deletedRecords == 100)
        #expect(status.heldBackBy.map(\.name) == ["tablet"])
        #expect(status.summary().hasPrefix("compaction held back by tablet, never seen"), "\(status.summary())")

        // The tablet comes back: it catches up, reports, and compaction proceeds everywhere.
        try await tablet.startSync(SyncConfiguration(security: .tls, listen: .loopback(0), peers: [.loopback(port)]))
        let purged = await eventually(timeout: .seconds(60)) {
            [a, b, tablet].allSatisfy { $0.state.records.invisibleRecordCount == 0 }
        }
        #expect(purged, "\([a, b, tablet].map { $0.compactionStatus().summary() })")
        #expect(a.compactionStatus().heldBackBy.isEmpty)
    }

    @Test("a device offline throughout that is removed no longer holds compaction back")
    func removedDeviceReleasesCompaction() async throws {
        let group = try LocalGroup.make(names: ["a", "b", "tablet"])
        let made = try (0..<3).map { try make(group, $0) }
        defer { Task { for (replica, directory) in made { await replica.stopSync(); removeTemporaryDirectory(directory) } } }
        let (a, b, tablet) = (made[0].0, made[1].0, made[2].0)
        try await star([a, b])
        _ = try await create(a, count: 100, label: "a")
        #expect(await eventually { (try? b.fetchAll(ShiftType.self).count) == 100 })
        try await deleteAll(a)
        #expect(await eventually { (try? b.fetchAll(ShiftType.self).isEmpty) == true })
        #expect(await eventually { a.compactionStatus().heldBackBy.map(\.name) == ["tablet"] })
        _ = try await a.compact()
        #expect(a.state.records.invisibleRecordCount == 100)
        try await a.removeDevice(tablet.deviceID)
        let purged = await eventually(timeout: .seconds(60)) {
            [a, b].allSatisfy { $0.state.records.invisibleRecordCount == 0 }
        }
        #expect(purged, "\([a, b].map { $0.compactionStatus().summary() })")
    }

    @Test("deletions the stored reports already make stable are purged when sync starts, with no new write or report (a process killed before its compaction step)")
    func purgesWhatIsStableWhenSyncStarts() async throws {
        let group = try LocalGroup.make(names: ["solo"])
        let (replica, directory) = try make(group, 0)
        defer { Task { await replica.stopSync(); removeTemporaryDirectory(directory) } }
        // Written and deleted through the store (no step scheduled), as a process that died
        // before its step would leave them.
        let shifts = (0..<10).map { ShiftType(symbol: "S\($0)", title: "s \($0)", duration: 3600) }
        _ = try replica.store.write { state in
            var delta = RecordMap.empty()
            for shift in shifts { if let d = try state.save(shift) { delta.merge(d) } }
            return delta
        }
        _ = try replica.store.write { state in
            var delta = RecordMap.empty()
            for shift in shifts { if let d = state.delete(ShiftType.self, id: shift.id) { delta.merge(d) } }
            return delta
        }
        #expect(replica.state.records.invisibleRecordCount == 10)
        // Its own report already says so (signed before the kill): starting signs none, so
        // nothing new arrives to trigger a step.
        try replica.store.saveOwnReport(SeenReport.signed(by: group.keys[0], group: group.groupID, replica: replica.store.replicaID,
                                                          time: HybridLogicalClock.wallClock(), context: replica.state.context))
        try await replica.startSync(SyncConfiguration(security: .tls, listen: .loopback(0)))
        #expect(await eventually { replica.state.records.invisibleRecordCount == 0 }, "\(replica.compactionStatus().summary())")
    }
}
