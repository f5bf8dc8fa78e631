import Foundation
@testable import PeerSync
import PeerSyncTestSupport
import Testing
import ShiftSchedulerModel

/// A shift type written with a typed reference instead of a plain UUID: same collection,
/// same field name.
struct TypedShiftType: SyncRecord, Hashable {
    static let collection = ShiftType.collection
    static let references = [RecordReference(field: "locationID", to: Location.self)]
    var id: UUID
    var symbol: String
    var title: String
    var description: String
    var duration: TimeInterval
    var locationID: Reference<Location>?
}

@Suite("References", .timeLimit(.minutes(6)))
struct ReferenceTests {
    @Test("a Reference encodes as the UUID field a plain UUID property writes")
    func wireCompatible() throws {
        let ward = Location(name: "Ward 3")
        let plain = ShiftType(symbol: "E", title: "Early", duration: 60, locationID: ward.id)
        let typed = TypedShiftType(id: plain.id, symbol: "E", title: "Early", description: "", duration: 60,
                                   locationID: Reference(ward))
        #expect(try FieldEncoder().encodeFields(typed) == FieldEncoder().encodeFields(plain))
        #expect(try FieldEncoder().encodeFields(typed)["locationID"] == .uuid(ward.id))
        // Either type reads what the other wrote.
        var state = ReplicaState(name: "r")
        try state.save(ward)
        try state.save(plain)
        #expect(try state.fetch(TypedShiftType.self, id: plain.id) == typed)
    }

    @Test("resolve gives the record or nil; a dangling reference reads nil; referencing queries follow")
    func resolveAndQuery() async throws {
        let app = try TestApp("refs")
        defer { Task { await app.close() } }
        let replica = app.replica
        let ward = Location(name: "Ward 3")
        let icu = Location(name: "ICU")
        try await replica.batch { b in
            try b.save(ward)
            try b.save(icu)
            try b.save(TypedShiftType(id: UUID(), symbol: "E", title: "Early", description: "", duration: 60, locationID: Reference(ward)))
            try b.save(ShiftType(symbol: "N", title: "Night", duration: 60, locationID: icu.id))
            try b.save(ShiftType(symbol: "L", title: "Late", duration: 60, locationID: ward.id))
        }
        let early = try #require(try replica.fetchAll(TypedShiftType.self, where: { $0.symbol == "E" }).first)
        #expect(try replica.resolve(early.locationID) == ward)
        #expect(titles(try replica.fetchAll(ShiftType.self, where: \.locationID == ward.id, sortedBy: [KeyPathComparator(\ShiftType.title)]))
                == ["Early", "Late"])
        #expect(titles(try replica.fetchAll(ShiftType.self, referencing: icu)) == ["Night"])

        let atWard = Recorder(replica.observe(ShiftType.self, where: .referencing(ward), sortedBy: [KeyPathComparator(\ShiftType.title)]))
        let early1 = Recorder(replica.observe(TypedShiftType.self, id: early.id))
        #expect(await atWard.wait(count: 1))
        #expect(await early1.wait(count: 1))
        #expect(titles(atWard.last ?? []) == ["Early", "Late"])

        // Deleting the ward: nothing is written on the shift types, but their references read nil.
        try await replica.delete(Location.self, id: ward.id)
        #expect(try replica.resolve(early.locationID) == nil)
        #expect(try replica.fetch(TypedShiftType.self, id: early.id)?.locationID == nil)
        #expect(await atWard.wait { $0.isEmpty })
        #expect(await early1.wait { $0?.locationID == nil })
        // It comes back (an edit concurrent with the delete would do this too): so do the links.
        try await replica.save(ward)
        #expect(await atWard.wait { titles($0) == ["Early", "Late"] })
        #expect(await early1.wait { $0?.locationID == Reference(ward) })
        #expect(atWard.all.count == 3 && early1.all.count == 3)
    }

    @Test("an edit in a batch after the target's delete keeps the reference: a concurrent rename on another device revives the target, and both devices point at it")
    func concurrentReviveOverSessions() async throws {
        let (a, b) = (try TestApp("a"), try TestApp("b"))
        defer { Task { await a.close(); await b.close() } }
        let ward = Location(name: "Ward 3")
        let shift = ShiftType(symbol: "N", title: "Night", duration: 36_000, locationID: ward.id)
        try await a.replica.batch { batch in
            try batch.save(ward)
            try batch.save(shift)
        }
        try await connect(a.replica, b.replica)
        #expect(await eventually { (try? b.replica.fetch(ShiftType.self, id: shift.id)) == shift })
        await a.replica.stopSync()
        await b.replica.stopSync()

        // Apart: a deletes the ward, then edits the shift (which reads no location); b renames the ward.
        try await a.replica.delete(Location.self, id: ward.id)
        try await a.replica.batch { batch in
            var edited = try #require(try batch.fetch(ShiftType.self, id: shift.id))
            #expect(edited.locationID == nil)
            edited.title = "Night (long)"
            try batch.save(edited)
        }
        var renamed = ward
        renamed.name = "Ward 3 North"
        try await b.replica.save(renamed)

        try await connect(a.replica, b.replica)
        var expected = shift
        expected.title = "Night (long)"
        let converged = await eventually {
            a.replica.state.digest == b.replica.state.digest
                && [a, b].allSatisfy { (try? $0.replica.fetch(ShiftType.self, id: shift.id)) == expected }
        }
        #expect(converged, "\((try? [a, b].map { try $0.replica.fetch(ShiftType.self, id: shift.id) }) ?? [])")
        for app in [a, b] { #expect(try app.replica.fetch(Location.self, id: ward.id) == renamed) }
    }
}

@Suite("Conflicts API", .timeLimit(.minutes(6)))
struct ConflictAPITests {
    /// Makes one concurrent overwrite of `title` in `app`'s replica: a remote replica "Ben"
    /// edits the same field later. Returns Ben's replica ID.
    func makeConflict(_ app: TestApp, title: String) async throws -> (ReplicaID, ShiftType) {
        let shift = ShiftType(symbol: "E", title: "Early", duration: 60)
        try await app.replica.save(shift)
        var ben = ReplicaState(name: "Ben", physicalClock: { HybridLogicalClock.wallClock() + 60_000 })
        ben.apply(app.replica.state.delta(missingFrom: ben.context))
        var mine = shift
        mine.title = "\(title) (Anna)"
        try await app.replica.save(mine)
        var theirs = shift
        theirs.title = "\(title) (Ben)"
        let delta = try #require(try ben.save(theirs))
        try app.replica.store.applyRemote(delta, from: "peer:Ben")
        return (ben.replicaID, shift)
    }

    @Test("read, observe, resolve; the resolved flag survives reopening")
    func readObserveResolve() async throws {
        let app = try TestApp("Anna")
        defer { Task { await app.close() } }
        let pending = Recorder(app.replica.observeConflicts())
        #expect(await pending.wait(count: 1))
        #expect(pending.last?.isEmpty == true)

        let (ben, shift) = try await makeConflict(app, title: "Early")
        #expect(await pending.wait { $0.count == 1 })
        let conflict = try #require(try app.replica.conflicts().first)
        #expect(conflict.record == shift.recordKey)
        #expect(conflict.field == "title")
        #expect(conflict.winner.value == "Early (Ben)" && conflict.winner.writer == ben)
        #expect(conflict.loser.value == "Early (Anna)" && conflict.loser.writer == app.replica.replicaID)
        #expect(conflict.loser.writerName == "Anna")
        #expect(conflict.winner.writerName == nil)  // never met: no name yet
        #expect(conflict.winner.writtenAt > conflict.loser.writtenAt)
        #expect(!conflict.isResolved)

        // The sync layer's hook names Ben; observers see the name.
        app.replica.setPeerName("Ben", for: ben)
        #expect(await pending.wait { $0.first?.winner.writerName == "Ben" })

        // Resolving removes it from the pending list, keeps it in the full one.
        #expect(try app.replica.resolveConflict(conflict.id))
        #expect(await pending.wait { $0.isEmpty })
        #expect(try app.replica.conflicts().map(\.isResolved) == [true])
        #expect(try app.replica.conflicts(includingResolved: false).isEmpty)
        #expect(try !app.replica.resolveConflict(9_999))

        // A second conflict is pending while the first stays resolved, also after reopening.
        _ = try await makeConflict(app, title: "Second")
        #expect(await pending.wait { $0.count == 1 })
        let reopened = try Replica.open(at: app.directory, logger: testLogger("reopened"))
        #expect(try reopened.conflicts().map(\.isResolved) == [true, false])
        #expect(try reopened.conflicts(includingResolved: false).map(\.loser.value) == ["Second (Anna)"])
        #expect(pending.error == nil)
    }

    @Test("two devices that edited one field apart and then meet log the same conflict")
    func bothSidesOfADirectMeeting() async throws {
        let (anna, ben) = (try TestApp("Anna"), try TestApp("Ben"))
        defer { Task { await anna.close(); await ben.close() } }
        let shift = ShiftType(symbol: "E", title: "Early", duration: 60)
        try await anna.replica.save(shift)
        try await connect(anna.replica, ben.replica)
        #expect(await eventually { (try? ben.replica.fetch(ShiftType.self, id: shift.id)) == shift })
        await anna.replica.stopSync()
        await ben.replica.stopSync()
        for (app, name) in [(anna, "Anna"), (ben, "Ben")] {
            var edited = shift
            edited.title = "Early (\(name))"
            try await app.replica.save(edited)
        }

        try await connect(anna.replica, ben.replica)
        func logged(_ app: TestApp) -> [String] {
            ((try? app.replica.conflicts()) ?? []).map { "\($0.record) \($0.field): \($0.winner.value) by \($0.winner.writer) over \($0.loser.value) by \($0.loser.writer)" }
        }
        let both = await eventually {
            anna.replica.state.digest == ben.replica.state.digest && logged(anna).count == 1 && logged(ben).count == 1
        }
        #expect(both, "Anna: \(logged(anna)), Ben: \(logged(ben))")
        #expect(logged(anna) == logged(ben))
    }
}
