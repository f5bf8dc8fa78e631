import Foundation
@testable import PeerSync
import PeerSyncModel
import PeerSyncTestSupport
import ShiftSchedulerModel
import Testing

/// A scheduled shift: a date, and a reference to its shift type.
struct ScheduledShift: SyncRecord, Hashable {
    static let collection = "scheduledShifts"
    static let references = [RecordReference(field: "shiftTypeID", collection: ShiftType.collection)]
    var id = UUID()
    var start: Date
    var shiftTypeID: UUID?
}

/// Queries people write (issue 31): windows relative to now that move as time passes,
/// observation across a reference, attachment availability as events.
@Suite("Queries people write", .timeLimit(.minutes(6)))
struct QueryTests {
    private static let calendar: Calendar = {
        var calendar = Calendar(identifier: .gregorian)
        calendar.timeZone = TimeZone(identifier: "UTC")!
        calendar.firstWeekday = 2  // weeks start on Monday
        return calendar
    }()

    private static func date(_ text: String) -> Date { try! Date(text, strategy: .iso8601) }

    @Test func thisWeekMovesPastMidnightOnAnInjectedClock() async throws {
        let app = try TestApp("planner")
        defer { Task { await app.close() } }
        let saturday = ScheduledShift(start: Self.date("2026-11-28T08:00:00Z"))
        let tuesday = ScheduledShift(start: Self.date("2026-12-01T08:00:00Z"))
        try await app.replica.save(saturday)
        try await app.replica.save(tuesday)

        let calendar = Self.calendar
        let thisWeek = RecordQuery(ScheduledShift.self, sortedBy: [KeyPathComparator(\ScheduledShift.start)])
            .during({ now in calendar.dateInterval(of: .weekOfYear, for: now)! }, at: \.start)
        let clock = ManualClock()
        // Sunday, one minute before midnight.
        let results = Recorder(app.replica.observe(thisWeek, clock: clock, startingAt: Self.date("2026-11-29T23:59:00Z")))
        defer { results.stop() }
        #expect(await results.wait(count: 1))
        #expect(results.last == [saturday])

        // The observation waits for the week's end; two minutes later it is next week.
        #expect(await eventually { clock.sleeperCount == 1 }, "the observation does not wait for the window's end")
        clock.advance(by: .seconds(120))
        #expect(await results.wait(count: 2))
        #expect(results.last == [tuesday])
        // A fetch evaluates the window once, against the system clock (next week is far off here).
        #expect(try app.replica.fetchAll(thisWeek).allSatisfy { calendar.isDate($0.start, equalTo: Date(), toGranularity: .weekOfYear) })
    }

    @Test func aRowIsRefreshedWhenItsReferencedRecordIsRenamed() async throws {
        let app = try TestApp("planner")
        defer { Task { await app.close() } }
        let night = ShiftType(symbol: "N", title: "Night", description: "", duration: 36_000, locationID: nil)
        try await app.replica.save(night)
        let shift = ScheduledShift(start: Self.date("2026-12-01T22:00:00Z"), shiftTypeID: night.id)
        try await app.replica.save(shift)

        let rows = Recorder(app.replica.observe(ScheduledShift.self))
        defer { rows.stop() }
        let row = Recorder(app.replica.observe(ScheduledShift.self, id: shift.id))
        defer { row.stop() }
        #expect(await rows.wait(count: 1))
        #expect(await row.wait(count: 1))
        try await app.replica.update(ShiftType.self, id: night.id) { $0.title = "Nights" }
        // The list and the single record come again, so rows that show the type's title refresh.
        #expect(await rows.wait(count: 2), "the list did not refresh when the referenced shift type was renamed")
        #expect(await row.wait(count: 2), "the record did not refresh when its shift type was renamed")
        #expect(rows.last == [shift])
        // A change to a shift type nobody here references refreshes nothing.
        let early = ShiftType(symbol: "E", title: "Early", description: "", duration: 28_800, locationID: nil)
        let before = app.replica.appSupport.observationRounds
        try await app.replica.save(early)
        #expect(await waitForRounds(app.replica, after: before, rounds: 2))
        #expect(rows.count == 2)
    }

    @Test func attachmentAvailabilityComesAsEvents() async throws {
        let a = try TestApp("photographer")
        let b = try TestApp("viewer")
        defer { Task { await a.close(); await b.close() } }
        let photo = try await a.replica.addAttachment(randomData(2_000_000, seed: 3), mediaType: "image/jpeg")
        let book = Book(id: UUID(), title: "Ward 3", cover: photo)
        try await a.replica.save(book)

        let availability = Recorder(b.replica.observeAvailability(of: photo))
        defer { availability.stop() }
        #expect(await availability.wait(count: 1))
        #expect(availability.last == .notYetAvailable)
        try await connect(a.replica, b.replica)
        let arrived = await availability.wait { if case .available = $0 { true } else { false } }
        #expect(arrived, "no availability event for the photo: \(availability.all)")
        if case .available(let url)? = availability.last {
            #expect(FileManager.default.contents(atPath: url.path)?.count == 2_000_000)
        }
        await a.replica.stopSync()
        await b.replica.stopSync()
    }
}
