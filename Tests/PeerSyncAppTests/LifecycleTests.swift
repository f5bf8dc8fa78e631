import Foundation
@testable import PeerSync
import PeerSyncTestSupport
import Testing

/// Closing a replica and opening it again (issue 31).
@Suite("Close and reopen", .timeLimit(.minutes(6)))
struct LifecycleTests {
    @Test func closeAndReopenLosesNothing() async throws {
        let anna = try TestApp("Anna's iPad")
        let ben = try TestApp("Ben's iPhone")
        defer { Task { await anna.close(); await ben.close() } }
        try await connect(anna.replica, ben.replica)
        let shifts = (0..<20).map { PlannedShift(title: "Shift \($0)", assignee: "Anna", note: "") }
        for shift in shifts { try await anna.replica.save(shift) }
        let last = try #require(shifts.last)
        try await anna.replica.update(PlannedShift.self, id: last.id) { $0.note = "the last save before close" }
        await anna.replica.close()
        await anna.replica.close()  // again: nothing happens

        // Writes after close are refused with one clear line; reads still answer.
        do {
            try await anna.replica.save(PlannedShift(title: "after close", assignee: "", note: ""))
            Issue.record("a save after close did not throw")
        } catch {
            #expect("\(error)".contains("was closed"), "\(error)")
        }
        #expect(try anna.replica.fetchAll(PlannedShift.self).count == 20)
        #expect(await anna.replica.currentStatus == .disabled)

        // The last save reached the peer before the goodbye, and the files reopen.
        #expect(await eventually { (try? ben.replica.fetch(PlannedShift.self, id: last.id))?.note == "the last save before close" })
        let reopened = try Replica.open(at: anna.directory, logger: testLogger("reopened"))
        #expect(try reopened.fetchAll(PlannedShift.self).count == 20)
        #expect(try reopened.fetch(PlannedShift.self, id: last.id)?.note == "the last save before close")
        try await reopened.update(PlannedShift.self, id: last.id) { $0.assignee = "Ben" }
        try await connect(reopened, ben.replica)
        #expect(await eventually { (try? ben.replica.fetch(PlannedShift.self, id: last.id))?.assignee == "Ben" })
        await reopened.close()
    }
}
