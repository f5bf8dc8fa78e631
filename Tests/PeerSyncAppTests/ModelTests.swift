import Foundation
import Observation
@testable import PeerSync
import PeerSyncTestSupport
import Synchronization
import Testing
import ShiftSchedulerModel

/// The `@Observable` model, used as a SwiftUI view would: read on the main actor, redrawn when
/// a property it read changes.
@Suite("Observable model", .timeLimit(.minutes(6)))
struct ModelTests {
    @Test("the model follows records, status, peers and conflicts; observation tracking fires")
    func followsTheReplica() async throws {
        let device = try TestApp("Anna's iPad")
        let other = try TestApp("Ben's Mac")
        defer { Task { await device.close(); await other.close() } }
        try await device.replica.save(ShiftType(symbol: "E", title: "Early", duration: 8 * 3600))

        let model = await MainActor.run {
            ReplicaModel(replica: device.replica, sortedBy: [KeyPathComparator(\ShiftType.title)])
        }
        #expect(await eventually { await MainActor.run { model.isLoaded } })
        #expect(await MainActor.run { titles(model.records) } == ["Early"])
        #expect(await MainActor.run { model.status } == .disabled)

        // A view reads `records`; a change to them must invalidate it.
        let redraws = Mutex(0)
        await MainActor.run {
            withObservationTracking { _ = model.records } onChange: { redraws.withLock { $0 += 1 } }
        }

        try await connect(device.replica, other.replica)
        try await other.replica.save(ShiftType(symbol: "N", title: "Night", duration: 10 * 3600))
        #expect(await eventually { await MainActor.run { titles(model.records) } == ["Early", "Night"] })
        #expect(redraws.withLock { $0 } == 1)
        #expect(await eventually { await MainActor.run { model.peers.map(\.info.name) } == ["Ben's Mac"] })
        #expect(await eventually {
            await MainActor.run { if case .inSync = model.status { true } else { model.status == .syncing(progress: nil) } }
        })

        // A concurrent overwrite: both edit the same field while apart; the loser shows up.
        await device.replica.stopSync()
        await other.replica.stopSync()
        #expect(await eventually { await MainActor.run { model.status } == .disabled })
        var early = try #require(try device.replica.fetchAll(ShiftType.self, where: { $0.symbol == "E" }).first)
        var theirs = early
        early.title = "Early (Anna)"
        try await device.replica.save(early)
        theirs.title = "Early (Ben)"
        try await other.replica.save(theirs)
        try await connect(device.replica, other.replica)
        #expect(await eventually { await MainActor.run { model.conflicts.count } == 1 })
        let conflict = try #require(await MainActor.run { model.conflicts.first })
        #expect(conflict.field == "title")
        // The later write wins (usually Ben's; within one millisecond the clocks decide).
        // Names: this device's own, and the other device's as the group's roster has it.
        let bensDevice = try #require(device.replica.roster().devices[other.replica.deviceID]?.name)
        let names: [FieldValue: String] = ["Early (Anna)": "Anna's iPad", "Early (Ben)": bensDevice]
        #expect(Set([conflict.winner.value, conflict.loser.value]) == Set(names.keys))
        #expect(conflict.winner.writerName == names[conflict.winner.value])
        #expect(conflict.loser.writerName == names[conflict.loser.value])
        #expect(conflict.winner.writer == (conflict.winner.value == "Early (Ben)" ? other.replica.replicaID : device.replica.replicaID))
        #expect(!conflict.isResolved)
        guard case .string(let winningTitle) = conflict.winner.value else { Issue.record("the winner is not a title"); return }
        #expect(await eventually { await MainActor.run { titles(model.records) } == [winningTitle, "Night"] })

        // Resolving it empties the list.
        try device.replica.resolveConflict(conflict.id)
        #expect(await eventually { await MainActor.run { model.conflicts.isEmpty } })
        await MainActor.run { model.stop() }
        #expect(await MainActor.run { model.failure } == nil)
    }
}
