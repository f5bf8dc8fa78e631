import Foundation
@testable import PeerSync
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import PeerSyncTestSupport
import Testing

/// A shift as a shift-planning app holds it: an edit sheet changes some fields, a teammate others.
struct PlannedShift: SyncRecord, Hashable {
    static let collection = "plannedShifts"
    var id = UUID()
    var title: String
    var assignee: String
    var note: String
    var done = false
}

/// Edits that never undo a teammate's (issue 31): `update`, `save(_:editedFrom:)`, and `save` of
/// a copy that is older than another device's change.
@Suite("Edits that cannot undo a teammate's", .timeLimit(.minutes(6)))
struct EditTests {
    /// Two synced devices; `body` gets them once both hold `shift`.
    private func withTeam(_ shift: PlannedShift, _ body: (Replica, Replica) async throws -> Void) async throws {
        let anna = try TestApp("Anna's iPad")
        let ben = try TestApp("Ben's iPhone")
        defer { Task { await anna.close(); await ben.close() } }
        try await connect(anna.replica, ben.replica)
        try await anna.replica.save(shift)
        let arrived = await eventually { (try? ben.replica.fetch(PlannedShift.self, id: shift.id)) != nil }
        try #require(arrived, "the shift did not reach Ben")
        try await body(anna.replica, ben.replica)
        await anna.replica.stopSync()
        await ben.replica.stopSync()
    }

    /// The failure the issue quotes: Anna's edit sheet holds the shift while Ben changes its
    /// note; she saves a new assignee. Before: her save wrote the old note back on both devices.
    @Test func staleEditSheetKeepsTheTeammatesValueOnBothDevices() async throws {
        let shift = PlannedShift(title: "Night", assignee: "Anna", note: "bring keys")
        try await withTeam(shift) { anna, ben in
            let original = try #require(try anna.fetch(PlannedShift.self, id: shift.id))  // the sheet opens
            var sheet = original
            try await ben.update(PlannedShift.self, id: shift.id) { $0.note = "keys are at the desk" }
            let seen = await eventually { (try? anna.fetch(PlannedShift.self, id: shift.id))?.note == "keys are at the desk" }
            try #require(seen, "Ben's note did not reach Anna")
            sheet.assignee = "Carla"

            // A plain save of the stale copy is refused and writes nothing.
            await #expect(throws: ReplicaError.self) { try await anna.save(sheet) }
            do {
                try await anna.save(sheet)
            } catch let error as ReplicaError {
                guard case ReplicaError.staleCopy(let text) = error else { Issue.record("expected staleCopy, got \(error)"); return }
                #expect(text.contains("note"), "the error names the field: \(text)")
                let bensName = try #require(ben.roster().devices[ben.deviceID]?.name)  // his device's name in the roster
                #expect(text.contains("changed by \(bensName)"), "the error names who changed it: \(text)")
            }
            #expect(try anna.fetch(PlannedShift.self, id: shift.id)?.assignee == "Anna")

            // The sheet saves what the user changed: the note stays Ben's everywhere.
            try await anna.save(sheet, editedFrom: original)
            let expected = PlannedShift(id: shift.id, title: "Night", assignee: "Carla", note: "keys are at the desk")
            #expect(try anna.fetch(PlannedShift.self, id: shift.id) == expected)
            let converged = await eventually { (try? ben.fetch(PlannedShift.self, id: shift.id)) == expected }
            #expect(converged, "Ben has \(String(describing: try? ben.fetch(PlannedShift.self, id: shift.id)))")
        }
    }

    @Test func updateWritesExactlyTheFieldsTheClosureChanged() async throws {
        let shift = PlannedShift(title: "Early", assignee: "Anna", note: "")
        try await withTeam(shift) { anna, ben in
            _ = try anna.fetch(PlannedShift.self, id: shift.id)
            try await ben.update(PlannedShift.self, id: shift.id) { $0.title = "Early (6-14)" }
            _ = await eventually { (try? anna.fetch(PlannedShift.self, id: shift.id))?.title == "Early (6-14)" }
            let updated = try await anna.update(PlannedShift.self, id: shift.id) { $0.assignee = "Ben" }
            #expect(updated.title == "Early (6-14)" && updated.assignee == "Ben")
            let expected = PlannedShift(id: shift.id, title: "Early (6-14)", assignee: "Ben", note: "")
            #expect(await eventually { (try? ben.fetch(PlannedShift.self, id: shift.id)) == expected })
            // An update that changes nothing writes nothing.
            let before = anna.state.context
            try await anna.update(PlannedShift.self, id: shift.id) { $0.assignee = "Ben" }
            #expect(anna.state.context == before)
        }
    }

    /// Own edits are edits, not stale copies: renaming a record and renaming it back works.
    @Test func renamingBackIsNotAStaleCopy() async throws {
        let app = try TestApp("solo")
        defer { Task { await app.close() } }
        var shift = PlannedShift(title: "A", assignee: "Anna", note: "")
        try await app.replica.save(shift)
        _ = try app.replica.fetchAll(PlannedShift.self)
        shift.title = "B"
        try await app.replica.save(shift)
        _ = try app.replica.fetch(PlannedShift.self, id: shift.id)
        shift.title = "A"
        try await app.replica.save(shift)
        #expect(try app.replica.fetch(PlannedShift.self, id: shift.id)?.title == "A")
    }

    @Test func missingRecordsAreNotRevivedByEdits() async throws {
        let app = try TestApp("solo")
        defer { Task { await app.close() } }
        let shift = PlannedShift(title: "A", assignee: "Anna", note: "")
        await #expect(throws: ReplicaError.recordNotFound("no record plannedShifts/\(shift.id.uuidString) (it was never saved here, or it was deleted); nothing was written")) {
            try await app.replica.update(PlannedShift.self, id: shift.id) { $0.title = "B" }
        }
        try await app.replica.save(shift)
        try await app.replica.delete(PlannedShift.self, id: shift.id)
        var edited = shift
        edited.note = "late"
        await #expect(throws: ReplicaError.self) { try await app.replica.save(edited, editedFrom: shift) }
        #expect(try app.replica.fetch(PlannedShift.self, id: shift.id) == nil)
    }

    @Test func batchesRefuseStaleCopiesToo() async throws {
        let shift = PlannedShift(title: "Late", assignee: "Anna", note: "a")
        try await withTeam(shift) { anna, ben in
            var copy = try #require(try anna.fetch(PlannedShift.self, id: shift.id))
            try await ben.update(PlannedShift.self, id: shift.id) { $0.note = "b" }
            _ = await eventually { (try? anna.fetch(PlannedShift.self, id: shift.id))?.note == "b" }
            copy.done = true
            await #expect(throws: ReplicaError.self) { try await anna.batch { try $0.save(copy) } }
            try await anna.batch { batch in try batch.update(PlannedShift.self, id: shift.id) { $0.done = true } }
            #expect(try anna.fetch(PlannedShift.self, id: shift.id)?.note == "b")
            #expect(try anna.fetch(PlannedShift.self, id: shift.id)?.done == true)
        }
    }

    /// Conflicts name both writers (their roster names, kept with the entry) after a relaunch,
    /// and give their values back typed.
    @Test func conflictNamesSurviveARelaunchAndValuesComeBackTyped() async throws {
        let anna = try TestApp("Anna's iPad")
        let ben = try TestApp("Ben's iPhone")
        defer { Task { await anna.close(); await ben.close() } }
        let shift = PlannedShift(title: "Night", assignee: "Anna", note: "a")
        try await anna.replica.save(shift)
        try await connect(anna.replica, ben.replica)
        #expect(await eventually { (try? ben.replica.fetch(PlannedShift.self, id: shift.id)) != nil })
        await anna.replica.stopSync()
        await ben.replica.stopSync()
        // Apart, both change the note; Ben's write is the later one.
        try await anna.replica.update(PlannedShift.self, id: shift.id) { $0.note = "Anna's note" }
        try await Task.sleep(for: .milliseconds(5))
        try await ben.replica.update(PlannedShift.self, id: shift.id) { $0.note = "Ben's note" }
        try await connect(anna.replica, ben.replica)
        #expect(await eventually { (try? anna.replica.conflicts().count) == 1 })
        await anna.replica.stopSync()
        await ben.replica.stopSync()
        let bensName = try #require(ben.replica.roster().devices[ben.replica.deviceID]?.name)

        let relaunched = try TestApp(sharing: anna, name: "Anna's iPad")
        let conflict = try #require(try relaunched.replica.conflicts().first)
        #expect(conflict.field == "note")
        #expect(conflict.winner.writerName == bensName)
        #expect(conflict.loser.writerName == "Anna's iPad")
        #expect(try conflict.winner.value(as: String.self) == "Ben's note")
        #expect(try conflict.loser.value(as: String.self) == "Anna's note")
        #expect(throws: ReplicaError.self) { try conflict.loser.value(as: Int.self) }
    }
}
