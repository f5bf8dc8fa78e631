@_spi(Engine) import PeerSyncCRDT
import PeerSyncTestSupport
import Testing

/// The behaviour DESIGN.md promises, one case each.
@Suite("CRDT semantics", .computeLane)
struct SemanticsTests {
    let a = testReplica(0)
    let b = testReplica(1)
    let key = RecordKey(collection: "shiftTypes", id: UUID())

    /// A replica of the record map with its own clock, as a model replica would hold it.
    struct Replica {
        let id: ReplicaID
        var map = RecordMap()
        var clock: HybridLogicalClock

        init(_ id: ReplicaID, wallClock: UInt64 = 1_000) {
            self.id = id
            clock = HybridLogicalClock(physicalClock: { wallClock })
        }

        @discardableResult
        mutating func write(_ fields: [String: FieldValue], _ key: RecordKey) throws -> RecordMap {
            try map.write(fields, to: key, at: clock.tick(), by: id)
        }

        @discardableResult
        mutating func receive(_ delta: RecordMap) -> MergeOutcome {
            let outcome = map.apply(delta)
            clock.observe(outcome.maxTimestamp)
            return outcome
        }
    }

    @Test("OR-set: concurrent add and remove → add wins")
    func orSetAddWins() throws {
        var left = ORSet<String>()
        try left.insert("x", by: a)
        var right = left
        let removal = right.remove("x")!       // right removes what it has seen…
        let addition = try left.insert("x", by: a) // …while left adds again concurrently
        left.merge(removal)
        right.merge(addition)
        #expect(left.contains("x"))
        #expect(left == right)
    }

    @Test("OR-set: a remove that saw the add wins over it")
    func orSetObservedRemove() throws {
        var left = ORSet<String>()
        let add = try left.insert("x", by: a)
        var right = ORSet<String>()
        right.merge(add)
        let removal = right.remove("x")!
        left.merge(removal)
        #expect(!left.contains("x"))
        #expect(left == right)
    }

    @Test("OR-set: 100k add/remove cycles leave metadata proportional to live elements")
    func orSetMetadataStaysSmall() throws {
        var set = ORSet<Int>()
        var other = ORSet<Int>()
        for cycle in 0..<100_000 {
            let element = cycle % 7
            let add = try set.insert(element, by: a)
            other.merge(add)
            if cycle % 3 != 0, let removal = other.remove(element) { set.merge(removal) }
        }
        for s in [set, other] {
            // One live dot per live element, no dots waiting in the cloud, one vector entry per replica.
            #expect(s.liveDotCount == s.count)
            #expect(s.context.cloudDotCount == 0)
            #expect(s.context.versionVector.count == 1)
            #expect(s.count <= 7)
        }
        #expect(set == other)
    }

    @Test("edit concurrent with delete → the record is back with all its fields")
    func editConcurrentWithDeleteRevives() throws {
        var left = Replica(a)
        var right = Replica(b)
        right.receive(try left.write(["symbol": "E", "title": "Early", "duration": 28_800], key))
        let deletion = try right.map.remove(key, by: right.id)!
        let edit = try left.write(["title": "Early shift"], key)
        left.receive(deletion)
        right.receive(edit)
        for replica in [left, right] {
            let record = replica.map.record(key)!
            #expect(record.isVisible)
            #expect(record.values == ["symbol": "E", "title": "Early shift", "duration": 28_800])
        }
        #expect(left.map == right.map)
        #expect(left.map.digest == right.map.digest)
    }

    @Test("a delete that saw every edit removes the record")
    func observedDeleteRemoves() throws {
        var left = Replica(a)
        var right = Replica(b)
        right.receive(try left.write(["symbol": "E"], key))
        left.receive(try right.map.remove(key, by: right.id)!)
        #expect(left.map.record(key)?.isVisible == false)
        #expect(left.map == right.map)
    }

    @Test("concurrent edits of different fields → both kept, no conflict")
    func differentFieldsBothKept() throws {
        var left = Replica(a)
        var right = Replica(b)
        right.receive(try left.write(["symbol": "E", "title": "Early"], key))
        let l = try left.write(["symbol": "F"], key)
        let r = try right.write(["title": "Frühdienst"], key)
        let lo = left.receive(r)
        let ro = right.receive(l)
        #expect(left.map.record(key)?.values == ["symbol": "F", "title": "Frühdienst"])
        #expect(left.map == right.map)
        #expect(lo.conflicts.isEmpty && ro.conflicts.isEmpty)
    }

    @Test("concurrent edits of one field → larger HLC wins, the loser is reported on both sides")
    func sameFieldLargerStampWins() throws {
        var left = Replica(a, wallClock: 2_000)
        var right = Replica(b, wallClock: 3_000)
        right.receive(try left.write(["title": "Early"], key))
        let l = try left.write(["title": "Left"], key)      // HLC 2000.1
        let r = try right.write(["title": "Right"], key)    // HLC 3000.0
        let leftOutcome = left.receive(r)
        let rightOutcome = right.receive(l)
        let winner = r.record(key)!.fields["title"]!
        let loser = l.record(key)!.fields["title"]!
        #expect(winner.timestamp > loser.timestamp)
        #expect(left.map.record(key)?.values["title"] == "Right")
        #expect(right.map.record(key)?.values["title"] == "Right")
        #expect(leftOutcome.conflicts == [FieldConflict(key: key, field: "title", winner: winner, loser: loser)])
        #expect(rightOutcome.conflicts == [FieldConflict(key: key, field: "title", winner: winner, loser: loser)])
    }

    @Test("a causally later write wins even when its wall clock is behind, and is no conflict")
    func causallyLaterWinsDespiteSlowClock() throws {
        var ahead = Replica(a, wallClock: 5_000_000)
        var behind = Replica(b, wallClock: 1_000)       // 83 minutes slow
        behind.receive(try ahead.write(["title": "Early"], key))
        let later = try behind.write(["title": "Early (changed)"], key)
        let outcome = ahead.receive(later)
        #expect(ahead.map.record(key)?.values["title"] == "Early (changed)")
        #expect(later.record(key)!.fields["title"]!.timestamp.physicalMilliseconds == 5_000_000)
        #expect(outcome.conflicts.isEmpty)
    }

    @Test("a record map delta is small: one field, one presence entry, one dot")
    func deltaIsSmall() throws {
        var left = Replica(a)
        try left.write(["symbol": "E", "title": "Early", "duration": 1], key)
        let delta = try left.write(["title": "Late"], key)
        #expect(delta.fieldCount == 1)
        #expect(delta.record(key)?.presence.count == 1)
        #expect(delta.context.versionVector.isEmpty && delta.context.cloudDotCount == 1)
    }

    @Test("extraction for an empty context is the full state")
    func extractionForNewPeerIsFullState() throws {
        var left = Replica(a)
        try left.write(["symbol": "E"], key)
        try left.write(["title": "x"], RecordKey(collection: "locations", id: UUID()))
        _ = try left.map.remove(key, by: a)
        #expect(left.map.delta(missingFrom: CausalContext()) == left.map)
    }

    @Test("extraction for an up-to-date peer carries no records")
    func extractionForEqualPeerIsEmpty() throws {
        var left = Replica(a)
        try left.write(["symbol": "E"], key)
        #expect(left.map.delta(missingFrom: left.map.context).recordCount == 0)
    }
}
