@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import PeerSyncTestSupport
import Testing
import ShiftSchedulerModel

/// Version 2 of an app's location type: it added `phone`.
struct LocationV2: SyncRecord, Equatable {
    static let collection = Location.collection
    var id: UUID
    var name: String
    var address: String
    var phone: String?
}

@Suite("Typed records")
struct TypedRecordTests {
    func pair() -> (ReplicaState, ReplicaState) {
        (ReplicaState(replicaID: testReplica(0), name: "a", physicalClock: { 1_000 }),
         ReplicaState(replicaID: testReplica(1), name: "b", physicalClock: { 1_000 }))
    }

    @Test("save then fetch gives the record back; id is the key, not a field")
    func roundTrip() throws {
        var (a, _) = pair()
        let office = Location(name: "Office", address: "Main St 1")
        let delta = try a.save(office)
        #expect(try a.fetch(Location.self, id: office.id) == office)
        #expect(delta?.record(office.recordKey)?.fields.keys.sorted() == ["address", "name"])
        #expect(try a.fetchAll(Location.self) == [office])
    }

    @Test("saving an unchanged record writes nothing; a change writes only that field")
    func diffWrites() throws {
        var (a, _) = pair()
        var shift = ShiftType(symbol: "E", title: "Early", duration: 8 * 3600)
        try a.save(shift)
        #expect(try a.save(shift) == nil)
        shift.title = "Early shift"
        let delta = try must(a.save(shift))
        #expect(delta.fieldCount == 1)
        #expect(delta.record(shift.recordKey)?.fields["title"]?.value == "Early shift")
    }

    @Test("setting an optional to nil clears the field")
    func nilClears() throws {
        var (a, _) = pair()
        let place = Location(name: "Ward 3")
        var shift = ShiftType(symbol: "N", title: "Night", duration: 36_000, locationID: place.id)
        try a.save(place)
        try a.save(shift)
        shift.locationID = nil
        try a.save(shift)
        #expect(try a.fetch(ShiftType.self, id: shift.id)?.locationID == nil)
        #expect(a.records.record(shift.recordKey)?.fields["locationID"]?.value == .null)
    }

    @Test("fields unknown to an older app version survive its edits and merges")
    func unknownFieldsSurvive() throws {
        var (newer, older) = pair()
        let id = UUID()
        // The newer app writes a location with a phone number.
        older.apply(try must(newer.save(LocationV2(id: id, name: "Depot", address: "Quay 4", phone: "+49 30 1234"))))
        // The older app, which knows no phone field, renames the location.
        var location = try must(older.fetch(Location.self, id: id))
        location.name = "Depot North"
        let edit = try must(older.save(location))
        #expect(edit.record(location.recordKey)?.fields.keys.sorted() == ["name"])
        newer.apply(edit)
        // Both still carry the phone, and the newer app reads the rename and the phone.
        #expect(older.records.record(location.recordKey)?.fields["phone"]?.value == "+49 30 1234")
        #expect(try newer.fetch(LocationV2.self, id: id) == LocationV2(id: id, name: "Depot North", address: "Quay 4", phone: "+49 30 1234"))
        // A third replica that only ever talks to the older one still receives the phone.
        var third = ReplicaState(replicaID: testReplica(2), name: "c")
        third.apply(older.delta(missingFrom: third.context))
        #expect(try third.fetch(LocationV2.self, id: id)?.phone == "+49 30 1234")
        #expect(third.digest == older.digest && older.digest == newer.digest)
    }

    @Test("a reference to a deleted location reads as nil, and nothing is written")
    func danglingReferenceReadsNil() throws {
        var (a, b) = pair()
        let place = Location(name: "Ward 3")
        let shift = ShiftType(symbol: "N", title: "Night", duration: 36_000, locationID: place.id)
        b.apply(try must(a.save(place)))
        b.apply(try must(a.save(shift)))
        let digestBefore = b.digest
        b.apply(try must(a.delete(Location.self, id: place.id)))
        #expect(try b.fetch(ShiftType.self, id: shift.id)?.locationID == nil)
        #expect(try b.fetch(Location.self, id: place.id) == nil)
        // The shift type's stored field is untouched: only the location's presence changed.
        #expect(b.records.record(shift.recordKey)?.fields["locationID"]?.value == .uuid(place.id))
        #expect(b.digest != digestBefore && b.digest == a.digest)
    }

    @Test("saving a record whose reference reads nil (target deleted) keeps the stored reference; a reference the app sets or clears is written")
    func danglingReferenceIsNotWrittenBack() throws {
        var (a, _) = pair()
        let ward = Location(name: "Ward 3")
        let icu = Location(name: "ICU")
        try a.save(ward)
        try a.save(icu)
        let id = UUID()
        try a.save(ShiftType(id: id, symbol: "N", title: "Night", duration: 36_000, locationID: ward.id))
        a.delete(Location.self, id: ward.id)
        func stored() -> FieldValue? { a.records.record(RecordKey(collection: ShiftType.collection, id: id))?.fields["locationID"]?.value }

        // Read (the reference reads nil), edit another field, save: only that field is written.
        var shift = try must(a.fetch(ShiftType.self, id: id))
        #expect(shift.locationID == nil)
        shift.title = "Night (long)"
        let edit = try must(a.save(shift))
        #expect(edit.record(shift.recordKey)?.fields.keys.sorted() == ["title"])
        #expect(stored() == .uuid(ward.id))
        // Saving what was read, unchanged, writes nothing; so does naming the same (deleted) target.
        #expect(try a.save(shift) == nil)
        shift.locationID = ward.id
        #expect(try a.save(shift) == nil)
        // The ward comes back: the shift points at it again.
        try a.save(ward)
        #expect(try a.fetch(ShiftType.self, id: id)?.locationID == ward.id)

        // A reference the app sets is written, whether or not its target exists …
        a.delete(Location.self, id: ward.id)
        shift = try must(a.fetch(ShiftType.self, id: id))
        shift.locationID = icu.id
        #expect(try must(a.save(shift)).record(shift.recordKey)?.fields.keys.sorted() == ["locationID"])
        #expect(stored() == .uuid(icu.id))
        let missing = UUID()
        shift.locationID = missing
        try a.save(shift)
        #expect(stored() == .uuid(missing))
        // (the app read nil for it now; a read-only save of that writes nothing)
        #expect(try a.save(try must(a.fetch(ShiftType.self, id: id))) == nil)
        // … and clearing a reference whose target exists writes null.
        shift.locationID = icu.id
        try a.save(shift)
        shift.locationID = nil
        #expect(try must(a.save(shift)).record(shift.recordKey)?.fields["locationID"]?.value == .null)
        #expect(stored() == .null)
    }

    @Test("an edit made after the target's delete does not detach the record when a concurrent edit revives the target")
    func concurrentReviveKeepsTheReference() throws {
        var (a, b) = pair()
        let ward = Location(name: "Ward 3")
        let shift = ShiftType(symbol: "N", title: "Night", duration: 36_000, locationID: ward.id)
        b.apply(try must(a.save(ward)))
        b.apply(try must(a.save(shift)))
        // a deletes the ward and then edits the shift; b renames the ward meanwhile.
        let delete = try must(a.delete(Location.self, id: ward.id))
        var edited = try must(a.fetch(ShiftType.self, id: shift.id))
        edited.title = "Night (long)"
        let edit = try must(a.save(edited))
        var renamed = ward
        renamed.name = "Ward 3 North"
        let rename = try must(b.save(renamed))
        a.apply(rename)
        b.apply(delete)
        b.apply(edit)
        for replica in [a, b] {
            #expect(try replica.fetch(Location.self, id: ward.id) == renamed)
            #expect(try replica.fetch(ShiftType.self, id: shift.id)?.locationID == ward.id)
            #expect(try replica.fetch(ShiftType.self, id: shift.id)?.title == "Night (long)")
        }
        #expect(a.digest == b.digest)
    }

    @Test("concurrent overwrite of one field lands in both conflict logs; separate fields do not")
    func conflictLog() throws {
        var a = ReplicaState(replicaID: testReplica(0), name: "a", physicalClock: { 1_000 })
        var b = ReplicaState(replicaID: testReplica(1), name: "b", physicalClock: { 2_000 })
        var shift = ShiftType(symbol: "E", title: "Early", duration: 28_800)
        b.apply(try must(a.save(shift)))
        shift.title = "From A"
        let fromA = try must(a.save(shift))
        shift.title = "From B"
        let fromB = try must(b.save(shift))
        a.apply(fromB)
        b.apply(fromA)
        b.apply(fromA)  // a duplicate delivery is not a second conflict
        for replica in [a, b] {
            #expect(replica.conflicts.entries.count == 1)
            let entry = try #require(replica.conflicts.entries.first)
            #expect(entry.field == "title" && entry.winner.value == "From B" && entry.loser.value == "From A")
            #expect(try replica.fetch(ShiftType.self, id: shift.id)?.title == "From B")
        }
    }

    /// ARCHITECTURE.md "Conflicts", ``ReplicaState/conflicts``: a replica logs a pair when one of
    /// its joins holds one value and receives the other. The loser's device always sees both;
    /// the winner's device only if the losing value reaches it before it is overwritten, since
    /// anti-entropy sends current values only.
    @Test("who logs a conflict: every replica that held one value and received the other; not a winner that only ever received the loser's overwritten write")
    func whoLogsAConflict() throws {
        func replicas() throws -> (ReplicaState, ReplicaState, ReplicaState, ShiftType) {
            var a = ReplicaState(replicaID: testReplica(0), name: "a", physicalClock: { 1_000 })
            var b = ReplicaState(replicaID: testReplica(1), name: "b", physicalClock: { 2_000 })
            var c = ReplicaState(replicaID: testReplica(2), name: "c", physicalClock: { 1_500 })
            var shift = ShiftType(symbol: "E", title: "Early", duration: 28_800)
            let created = try must(a.save(shift))
            b.apply(created)
            c.apply(created)
            shift.title = "From A"  // loses: a's clock is behind b's
            try a.save(shift)
            shift.title = "From B"
            try b.save(shift)
            return (a, b, c, shift)
        }
        /// (field, winner, loser) of each entry.
        func logged(_ replica: ReplicaState) -> [[FieldValue]] {
            replica.conflicts.entries.map { [.string($0.field), $0.winner.value, $0.loser.value] }
        }
        let pair: [[FieldValue]] = [["title", "From B", "From A"]]

        // Through a third replica that received the loser first: it logs, and so does the loser's
        // device when the winner arrives; the winner's device receives a's write as a presence
        // entry and a context only (the value was overwritten on c), and logs nothing.
        var (a, b, c, shift) = try replicas()
        c.apply(a.delta(missingFrom: c.context))
        c.apply(b.delta(missingFrom: c.context))
        a.apply(c.delta(missingFrom: a.context))
        b.apply(c.delta(missingFrom: b.context))
        #expect(logged(c) == pair && logged(a) == pair)
        #expect(logged(b).isEmpty)
        #expect(a.digest == b.digest && b.digest == c.digest)
        #expect(try b.fetch(ShiftType.self, id: shift.id)?.title == "From B")

        // Two devices, but the loser's device received the winner before it sent its own write
        // (a session that dropped before its catch-up was sent): the same.
        (a, b, _, _) = try replicas()
        a.apply(b.delta(missingFrom: a.context))
        b.apply(a.delta(missingFrom: b.context))
        #expect(logged(a) == pair && logged(b).isEmpty)
        #expect(a.digest == b.digest)

        // Two devices that exchange what each lacked when they met (each catch-up computed before
        // the other's is applied, as a session does): both log it.
        (a, b, _, _) = try replicas()
        let (toB, toA) = (a.delta(missingFrom: b.context), b.delta(missingFrom: a.context))
        a.apply(toA)
        b.apply(toB)
        #expect(logged(a) == pair && logged(b) == pair)
    }

    @Test("the conflict log is bounded")
    func conflictLogBounded() {
        var log = ConflictLog(capacity: 3)
        for i in 0..<10 {
            let loser = FieldRegister(value: .int(Int64(i)), timestamp: .zero, dot: Dot(replica: testReplica(0), counter: UInt64(i + 1)), supersedes: .zero)
            log.record(ConflictEntry(key: .syncedSettings, field: "f", winner: loser, loser: loser, detectedAt: .zero))
        }
        #expect(log.entries.map(\.loser.value) == [7, 8, 9])
    }
}

@Suite("Settings")
struct SettingsTests {
    @Test("synced settings travel, local settings never do")
    func scopes() throws {
        var a = ReplicaState(replicaID: testReplica(0), name: "a")
        var b = ReplicaState(replicaID: testReplica(1), name: "b")
        let synced = try must(a.setSetting(SettingKey.weekStart, to: 1, scope: .synced))
        #expect(a.setSetting(SettingKey.powerMode, to: "low", scope: .local) == nil)
        b.apply(synced)
        b.apply(a.delta(missingFrom: b.context))
        #expect(b.setting(SettingKey.weekStart, scope: .synced) == 1)
        #expect(b.setting(SettingKey.powerMode, scope: .local) == nil)
        #expect(a.setting(SettingKey.powerMode, scope: .local) == "low")
        #expect(a.settings(scope: .synced) == [SettingKey.weekStart: 1])
    }

    @Test("unsetting a synced key syncs the removal; setting the same value is a no-op")
    func unset() throws {
        var a = ReplicaState(replicaID: testReplica(0), name: "a")
        var b = ReplicaState(replicaID: testReplica(1), name: "b")
        b.apply(try must(a.setSetting(SettingKey.retentionDays, to: 30, scope: .synced)))
        #expect(a.setSetting(SettingKey.retentionDays, to: 30, scope: .synced) == nil)
        b.apply(try must(a.setSetting(SettingKey.retentionDays, to: nil, scope: .synced)))
        #expect(b.setting(SettingKey.retentionDays, scope: .synced) == nil)
        #expect(b.settings(scope: .synced).isEmpty)
    }
}

@Suite("Field coding")
struct FieldCodingTests {
    struct Nested: Codable, Equatable {
        struct Inner: Codable, Equatable { var tags: [String]; var weight: Double? }
        var inner: Inner
        var list: [Inner]
        var big: UInt64
        var small: Int8
        var flag: Bool
        var data: Data
        var date: Date
    }

    @Test("nested structs, arrays, optionals, Data and Date round-trip")
    func roundTrip() throws {
        let value = Nested(inner: .init(tags: ["a", "b"], weight: nil), list: [.init(tags: [], weight: 2.5)],
                           big: 1 << 40, small: -3, flag: true, data: Data([1, 2, 3]), date: Date(timeIntervalSince1970: 1_000))
        let encoded = try FieldEncoder().encode(value)
        #expect(try FieldDecoder().decode(Nested.self, from: encoded) == value)
    }

    @Test("a type mismatch names the field")
    func mismatchNamesField() {
        #expect {
            _ = try FieldDecoder().decode(Location.self, fromFields: ["id": .string(UUID().uuidString), "name": .int(3), "address": ""])
        } throws: { error in
            "\(error)".contains("name")
        }
    }
}
