import Foundation
@testable import PeerSync
import PeerSyncTestSupport
import Testing
import ShiftSchedulerModel

struct ImportFailed: Error {}

/// Batches: one transaction, one delta, all or nothing — also across kill -9.
@Suite("Batches", .ownThread, .timeLimit(.minutes(6)))
struct BatchTests {
    @Test("a batch commits one transaction and ships one delta")
    func oneTransactionOneDelta() async throws {
        let a = try TestApp("a")
        let b = try TestApp("b")
        defer { Task { await a.close(); await b.close() } }
        let stale = Location(name: "closed ward")
        try await a.replica.save(stale)
        try await connect(a.replica, b.replica)
        #expect(try await eventually { try b.replica.fetch(Location.self, id: stale.id) != nil })
        #expect(await eventually { a.replica.state.digest == b.replica.state.digest })  // both catch-ups are in
        let journalBefore = try a.replica.store.journal(limit: 1_000).count
        let receivedBefore = try b.replica.store.journal(limit: 1_000).count
        let peerChanges = b.replica.changes()

        let books = (0..<50).map { ShiftType(symbol: "B", title: "import \($0)", duration: 60) }
        let written = try await a.replica.batch { batch in
            for book in books { try batch.save(book) }
            try batch.delete(stale)
            try batch.setSetting(SettingKey.weekStart, to: 7, scope: .synced)
            try batch.setSetting(SettingKey.powerMode, to: "low", scope: .local)
            // Reads inside the batch see its own writes.
            #expect(try batch.fetchAll(ShiftType.self).count == 50)
            #expect(try batch.fetch(Location.self, id: stale.id) == nil)
            return batch.changeCount
        }
        #expect(written == 52)  // 50 saves, a delete, a synced setting (local settings ship nothing)
        #expect(try a.replica.store.journal(limit: 1_000).count == journalBefore + 1)

        // The peer gets it as one delta: one remote change naming every record, one commit.
        // (Skip a late event of the catch-up that brought the stale location.)
        var iterator = peerChanges.makeAsyncIterator()
        var change = try #require(await iterator.next())
        // (Skip late events of the catch-ups: the stale location, roster entries.)
        while !change.records.contains(books[0].recordKey) {
            change = try #require(await iterator.next())
        }
        #expect(change.records.count == 52, "\(change.records.sorted().map(\.description))")  // 50 shift types, the location, the settings record
        #expect(Set(books.map(\.recordKey)).isSubset(of: change.records))
        #expect(try await eventually { try b.replica.fetchAll(ShiftType.self).count == 50 })
        #expect(try b.replica.fetch(Location.self, id: stale.id) == nil)
        #expect(b.replica.setting(SettingKey.weekStart, scope: .synced) == 7)
        #expect(b.replica.setting(SettingKey.powerMode, scope: .local) == nil)
        #expect(try b.replica.store.journal(limit: 1_000).count == receivedBefore + 1)
    }

    @Test("a throw inside the batch writes nothing, in memory or on disk")
    func throwRollsBack() async throws {
        let app = try TestApp("rollback")
        defer { Task { await app.close() } }
        let kept = Location(name: "kept")
        try await app.replica.save(kept)
        let digest = app.replica.state.digest
        let changes = app.replica.changes()
        await #expect(throws: ImportFailed.self) {
            try await app.replica.batch { batch in
                for i in 0..<100 { try batch.save(Location(name: "half-imported \(i)")) }
                try batch.delete(kept)
                try batch.setSetting("lastImport", to: 1, scope: .local)
                throw ImportFailed()
            }
        }
        #expect(app.replica.state.digest == digest)
        #expect(try app.replica.fetchAll(Location.self) == [kept])
        #expect(app.replica.setting("lastImport", scope: .local) == nil)
        let reopened = try ReplicaStore.open(directory: app.directory)
        #expect(reopened.state.digest == digest)
        #expect(reopened.state.setting("lastImport", scope: .local) == nil)
        // Nothing was published either: the next change is the next real one.
        try await app.replica.save(Location(name: "after"))
        var iterator = changes.makeAsyncIterator()
        #expect(await iterator.next()?.records.count == 1)
    }

    @Test("a batch used after its closure returned refuses")
    func closedBatchRefuses() async throws {
        let app = try TestApp("closed")
        defer { Task { await app.close() } }
        let escaped = try await app.replica.batch { $0 }
        #expect(throws: ReplicaError.batchClosed) { try escaped.save(Location(name: "late")) }
        #expect(try app.replica.fetchAll(Location.self).isEmpty)
    }

    @Test("SIGKILL at a random instant: every batch is on disk whole or not at all", arguments: 0..<10)
    func killNineLeavesWholeBatches(trial: Int) async throws {
        let directory = try makeTemporaryDirectory("peersync-batch-kill")
        defer { removeTemporaryDirectory(directory) }
        _ = try ReplicaStore.create(directory: directory, name: "victim")
        var rng = SeededGenerator(seed: baseSeed &+ 1_000 &+ UInt64(trial))
        let size = 300
        // Kill after 1–8 reported batches, plus 0–150 ms: anywhere in the next one (a batch of 300
        // takes ~110 ms in a debug build, all of it inside its transaction).
        let killAfter = Int.random(in: 1...8, using: &rng)
        let extra = Int.random(in: 0...150, using: &rng)
        let child = try ChildProcess(buildProductsDirectory().appendingPathComponent("peersync-app-child").path,
                                     ["batch", directory, "\(size)"])
        var reported = 0
        let deadline = ContinuousClock.now + .seconds(120)
        while reported < killAfter, let line = child.readLine(until: deadline) {
            if line.hasPrefix("committed ") { reported = Int(line.dropFirst("committed ".count)) ?? reported }
        }
        #expect(reported >= killAfter, "child stopped early (seed \(baseSeed &+ 1_000 &+ UInt64(trial)))")
        let killAt = ContinuousClock.now + .milliseconds(extra)
        while ContinuousClock.now < killAt {
            if let line = child.readLine(until: killAt), line.hasPrefix("committed ") {
                reported = Int(line.dropFirst("committed ".count)) ?? reported
            }
        }
        child.kill(SIGKILL)
        while let line = child.readLine(until: .now + .seconds(5)) {
            if line.hasPrefix("committed ") { reported = Int(line.dropFirst("committed ".count)) ?? reported }
        }

        let reopened = try ReplicaStore.open(directory: directory)
        let locations = try reopened.state.fetchAll(Location.self)
        var perBatch: [String: Int] = [:]
        for location in locations where location.address != "marker" { perBatch[location.address, default: 0] += 1 }
        let batches = perBatch.keys.compactMap(Int.init).sorted()
        // Whole or absent: every batch present has all its records…
        #expect(perBatch.values.allSatisfy { $0 == size }, "partial batch: \(perBatch.filter { $0.value != size })")
        // …they are exactly batches 1…n, n at least the last one reported committed…
        #expect(batches == Array(1..<(batches.count + 1)))
        #expect(batches.count >= reported)
        // …and the setting and the markers moved with them: one marker, the last batch's.
        let markers = locations.filter { $0.address == "marker" }
        #expect(markers.map(\.name) == ["marker \(batches.count)"])
        #expect(reopened.state.setting("lastBatch", scope: .synced) == .int(Int64(batches.count)))
        try reopened.write { try $0.save(Location(name: "after the crash")) }
    }
}
