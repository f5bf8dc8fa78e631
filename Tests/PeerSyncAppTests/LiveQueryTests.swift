import Foundation
@testable import PeerSync
import PeerSyncTestSupport
import Testing
import ShiftSchedulerModel

/// Live queries over real stores: what they emit, when, and in which order.
@Suite("Live queries", .timeLimit(.minutes(6)))
struct LiveQueryTests {
    let byTitle = [KeyPathComparator(\ShiftType.title)]

    @Test("emits the current result at once, then once per relevant change, never for an unrelated one")
    func emitsOncePerRelevantChange() async throws {
        let app = try TestApp("observer")
        defer { Task { await app.close() } }
        let replica = app.replica
        try await replica.save(ShiftType(symbol: "E", title: "Early", duration: 8 * 3600))
        let night = ShiftType(symbol: "N", title: "Night", duration: 10 * 3600)
        try await replica.save(night)

        // Given a live query of the long shifts, by title
        let long = Recorder(replica.observe(ShiftType.self, where: { $0.duration >= 9 * 3600 }, sortedBy: byTitle))
        #expect(await long.wait(count: 1))
        #expect(long.all.map(titles) == [["Night"]])

        // When a relevant record is added, edited and deleted, one element each
        let late = ShiftType(symbol: "L", title: "Late", duration: 9 * 3600)
        try await replica.save(late)
        #expect(await long.wait(count: 2))
        var renamed = late
        renamed.title = "Late (long)"
        try await replica.save(renamed)
        #expect(await long.wait(count: 3))
        try await replica.delete(ShiftType.self, id: night.id)
        #expect(await long.wait(count: 4))
        #expect(long.all.map(titles) == [["Night"], ["Late", "Night"], ["Late (long)", "Night"], ["Late (long)"]])

        // When a record of another collection changes: not even looked at
        var rounds = replica.appSupport.observationRounds
        try await replica.save(Location(name: "Ward 3"))
        // When a record the predicate excludes changes without entering the result: looked at, not emitted
        try await replica.save(ShiftType(symbol: "S", title: "Short", duration: 3600))
        #expect(await waitForRounds(replica, after: rounds))
        // When a record is saved unchanged: nothing is written, nothing emitted
        try await replica.save(renamed)
        rounds = replica.appSupport.observationRounds
        // When a setting changes: another collection again
        try await replica.setSetting(SettingKey.weekStart, to: 1, scope: .synced)
        #expect(long.count == 4)

        // Then the next relevant change is the very next element
        try await replica.save(ShiftType(symbol: "X", title: "Extra long", duration: 12 * 3600))
        #expect(await long.wait(count: 5))
        #expect(long.all.count == 5)
        #expect(titles(long.last ?? []) == ["Extra long", "Late (long)"])
        #expect(replica.appSupport.observationRounds >= rounds + 1)
        #expect(long.error == nil)
    }

    @Test("changes arriving while the consumer is busy come out as one element with the latest result")
    func coalesces() async throws {
        let app = try TestApp("coalescing")
        defer { Task { await app.close() } }
        let replica = app.replica
        var iterator = replica.observe(ShiftType.self, sortedBy: byTitle).makeAsyncIterator()
        #expect(try await iterator.next()?.isEmpty == true)
        // The consumer is busy (does not ask for the next element) while 20 changes commit.
        for i in 0..<20 { try await replica.save(ShiftType(symbol: "A", title: String(format: "A%02d", i), duration: 60)) }
        let next = try #require(try await iterator.next())
        #expect(titles(next) == (0..<20).map { String(format: "A%02d", $0) })
        // Nothing is pending: the next element is the next change.
        try await replica.save(ShiftType(symbol: "B", title: "B", duration: 60))
        #expect(titles(try #require(try await iterator.next())).last == "B")
    }

    @Test("settings: one key and a whole scope, synced and local, each emitted only when it changes")
    func settings() async throws {
        let app = try TestApp("settings")
        defer { Task { await app.close() } }
        let replica = app.replica
        let weekStart = Recorder(replica.observeSetting(SettingKey.weekStart, scope: .synced))
        let synced = Recorder(replica.observeSettings(scope: .synced))
        let power = Recorder(replica.observeSetting(SettingKey.powerMode, scope: .local))
        #expect(await weekStart.wait(count: 1))
        #expect(await synced.wait(count: 1))
        #expect(await power.wait(count: 1))
        try await replica.setSetting(SettingKey.weekStart, to: 1, scope: .synced)
        try await replica.setSetting(SettingKey.retentionDays, to: 30, scope: .synced)
        try await replica.setSetting(SettingKey.powerMode, to: "low", scope: .local)
        #expect(await weekStart.wait { $0 == 1 })
        #expect(await synced.wait { $0 == [SettingKey.weekStart: 1, SettingKey.retentionDays: 30] })
        #expect(await power.wait { $0 == "low" })
        // Another synced key and a record change do not touch weekStart or powerMode.
        let rounds = replica.appSupport.observationRounds
        try await replica.setSetting(SettingKey.retentionDays, to: 31, scope: .synced)
        try await replica.save(Location(name: "elsewhere"))
        #expect(await synced.wait { $0[SettingKey.retentionDays] == 31 })
        #expect(await waitForRounds(replica, after: rounds, rounds: 2))  // weekStart looked, and synced
        try await replica.setSetting(SettingKey.weekStart, to: nil, scope: .synced)
        #expect(await weekStart.wait { $0 == nil })
        #expect(weekStart.all == [nil, 1, nil])
        #expect(power.all == [nil, "low"])
    }

    @Test("the incremental result always equals the query evaluated from scratch", arguments: 0..<3)
    func incrementalEqualsFromScratch(seed: Int) async throws {
        let app = try TestApp("random")
        defer { Task { await app.close() } }
        let replica = app.replica
        var rng = SeededGenerator(seed: baseSeed &+ UInt64(seed))
        let locations = (0..<4).map { Location(name: "L\($0)") }
        for location in locations { try await replica.save(location) }
        let ward = locations[0]
        // A query with a predicate, a two-level order and a reference that can dangle.
        let query = RecordQuery(ShiftType.self, where: { $0.duration > 1000 || $0.locationID != nil },
                                sortedBy: [KeyPathComparator(\ShiftType.symbol), KeyPathComparator(\ShiftType.duration, order: .reverse)])
        let live = Recorder(replica.observe(query))
        let atWard = Recorder(replica.observe(ShiftType.self, where: .referencing(ward)))
        #expect(await live.wait(count: 1))
        #expect(await atWard.wait(count: 1))
        var ids: [UUID] = []
        for step in 0..<150 {
            try await replica.batch { b in
                for _ in 0..<Int.random(in: 1...3, using: &rng) {
                    switch Int.random(in: 0..<10, using: &rng) {
                    case 0..<4:
                        let id = UUID()
                        ids.append(id)
                        try b.save(ShiftType(id: id, symbol: ["A", "B", "C"].randomElement(using: &rng)!, title: "t\(step)",
                                             duration: Double(Int.random(in: 0...2000, using: &rng)),
                                             locationID: Bool.random(using: &rng) ? locations.randomElement(using: &rng)!.id : nil))
                    case 4..<7:
                        guard let id = ids.randomElement(using: &rng), var record = try b.fetch(ShiftType.self, id: id) else { continue }
                        record.duration = Double(Int.random(in: 0...2000, using: &rng))
                        record.symbol = ["A", "B", "C"].randomElement(using: &rng)!
                        try b.save(record)
                    case 7:
                        guard let id = ids.randomElement(using: &rng) else { continue }
                        try b.delete(ShiftType.self, id: id)
                    case 8:
                        // A location vanishes or comes back: shift types pointing at it read nil / the ID again.
                        let location = locations.randomElement(using: &rng)!
                        if try b.fetch(Location.self, id: location.id) == nil { try b.save(location) } else {
                            try b.delete(Location.self, id: location.id)
                        }
                    default:
                        try b.save(Location(name: "unrelated \(step)"))
                    }
                }
            }
            let expected = try replica.fetchAll(query)
            let expectedAtWard = try replica.fetchAll(ShiftType.self, where: .referencing(ward))
            // The live result may skip states, but catches up, and is never wrong meanwhile.
            let caughtUp = await live.wait(timeout: .seconds(10)) { $0 == expected }
            let caughtUpAtWard = await atWard.wait(timeout: .seconds(10)) { $0 == expectedAtWard }
            #expect(caughtUp && caughtUpAtWard, "step \(step), seed \(baseSeed &+ UInt64(seed))")
            if !caughtUp || !caughtUpAtWard { return }
        }
        // Every element was in the query's order, and no two in a row were equal.
        for element in live.all {
            #expect(element == element.sorted(by: query.areInIncreasingOrder))
        }
        #expect(zip(live.all, live.all.dropFirst()).allSatisfy { $0 != $1 })
        #expect(zip(atWard.all, atWard.all.dropFirst()).allSatisfy { $0 != $1 })
        #expect(live.error == nil && atWard.error == nil)
    }
}
