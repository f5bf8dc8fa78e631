@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import PeerSyncTestSupport
import Testing
import ShiftSchedulerModel

@Suite("Validation limits: replica state, import, decoding typed records")
struct LimitsModelTests {
    let me = testReplica(0)
    let peer = testReplica(1)

    /// A delta from `peer` that carries a dot of `me` with `counter` (what a hostile peer sends).
    func hostileDelta(counter: UInt64) -> RecordMap {
        let key = RecordKey(collection: Location.collection, id: UUID())
        let dot = Dot(replica: me, counter: counter)
        let state = RecordState(fields: ["name": FieldRegister(value: "planted", timestamp: HLCTimestamp(physicalMilliseconds: 900, logical: 0),
                                                               dot: dot, supersedes: .zero)],
                                presence: [me: PresenceEntry(counter: counter, removedBy: nil)])
        return RecordMap(records: [(key, state)], context: CausalContext(dots: [dot]), maintainingDigest: false)
    }

    @Test("at the counter limit every local change fails cleanly and changes nothing")
    func counterExhausted() throws {
        var state = ReplicaState(replicaID: me, name: "me", physicalClock: { 1_000 })
        let office = Location(name: "Office", address: "Main St 1")
        try state.save(office)
        state.apply(hostileDelta(counter: ValidationLimits.maxCounter))
        let before = state.records
        let exhausted = CounterExhaustedError(replica: me)

        #expect(throws: exhausted) { try state.save(Location(name: "New", address: "")) }
        #expect(state.localChangeFailure == nil)  // save throws instead of recording
        #expect(state.write(["name": "x"], to: office.recordKey).isEmpty)
        #expect(state.localChangeFailure == exhausted)
        #expect(throws: exhausted) { try state.throwIfLocalChangeFailed() }
        #expect(state.localChangeFailure == nil)
        #expect(state.upsert(["name": "y"], to: office.recordKey) == nil)
        #expect(state.delete(office.recordKey) == nil)
        #expect(state.delete(Location.self, id: office.id) == nil)
        #expect(state.setSetting("weekStart", to: 1, scope: .synced) == nil)
        #expect(state.localChangeFailure == exhausted)
        #expect(state.records == before)
        // Local settings are not events: they still work.
        #expect(state.setSetting("window", to: 1, scope: .local) == nil && state.setting("window", scope: .local) == 1)
        #expect(exhausted.description.contains("create a new replica"))
        // The error clears once a change succeeds again elsewhere: another replica is unaffected.
        var fresh = ReplicaState(replicaID: peer, name: "peer", physicalClock: { 1_000 })
        fresh.apply(state.delta(missingFrom: CausalContext()))
        #expect(try fresh.save(Location(name: "Fine", address: "")) != nil)
    }

    @Test("one below the limit, the last write succeeds")
    func lastCounter() throws {
        var state = ReplicaState(replicaID: me, name: "me", physicalClock: { 1_000 })
        state.apply(hostileDelta(counter: ValidationLimits.maxCounter - 1))
        let delta = try #require(try state.save(Location(name: "Last", address: "")))
        #expect(delta.context.maxCounter(of: me) == ValidationLimits.maxCounter)
        #expect(delta.limitViolation == nil)
        #expect(throws: CounterExhaustedError.self) { try state.save(Location(name: "One more", address: "")) }
    }

    @Test("shift durations: NaN, ±infinity, negative and over 366 days are invalid")
    func durations() {
        for bad in [Double.nan, .infinity, -.infinity, -1, 1e300, ShiftType.maximumDuration + 1] {
            #expect(ShiftType.durationViolation(bad) != nil, "\(bad)")
        }
        for good in [0, 28_800, ShiftType.maximumDuration] {
            #expect(ShiftType.durationViolation(good) == nil, "\(good)")
        }
        #expect(!ShiftType(symbol: "N", title: "NaN", duration: .nan).hasValidDuration)
    }

    func importing(_ json: String) throws(DataExchange.ImportError) -> ReplicaState {
        var state = ReplicaState(replicaID: me, name: "me", physicalClock: { 1_000 })
        _ = try DataExchange.importData(Data(json.utf8), into: &state)
        return state
    }

    @Test("import refuses out-of-range durations with one line naming entry and field, and changes nothing")
    func importDurations() throws {
        let id = "6A1C3B8E-0C47-4F59-9E8B-1D2A3C4B5E6F"
        let cases: [(String, String)] = [
            (#"[{"id": "\#(id)", "symbol": "E", "duration": 1e300}]"#, "entry 0.duration 1e+300"),
            (#"[{"id": "\#(id)", "symbol": "E", "duration": -5}]"#, "entry 0.duration -5"),
            (#"[{"id": "\#(id)", "symbol": "E", "duration": 9223372036854775807}]"#, "entry 0.duration 9223372036854775807"),
            (#"[{"id": "\#(id)", "symbol": "E", "duration": "P\#(String(repeating: "9", count: 400))D"}]"#, "entry 0.duration \"P999"),
            (#"[{"id": "\#(id)", "symbol": "E", "duration": "PT9000H"}]"#, "over the maximum"),
            (#"[{"id": "\#(id)", "symbol": "E", "duration": "NaN"}]"#, "not an ISO 8601 duration"),
            (#"{"format": "peersync-export", "version": 1, "collections": {"shiftTypes": [{"id": "\#(id)", "symbol": "E", "title": "E", "description": "", "duration": 1e300}]}}"#,
             "shiftTypes[0].duration 1e+300 is not a valid duration"),
            (#"{"format": "peersync-export", "version": 1, "collections": {"shiftTypes": [{"id": "\#(id)", "symbol": "E", "duration": "NaN"}]}}"#,
             "shiftTypes[0].duration must be seconds"),
        ]
        for (json, message) in cases {
            #expect {
                _ = try importing(json)
            } throws: { error in
                let text = "\(error)"
                return text.contains(message) && !text.contains("\n")
            }
        }
        let state = try importing(#"[{"id": "\#(id)", "symbol": "E", "duration": "PT8H"}]"#)
        #expect(try state.fetchAll(ShiftType.self).map(\.duration) == [28_800])
    }

    @Test("import into an exhausted replica fails with the counter error, not a trap")
    func importExhausted() {
        var state = ReplicaState(replicaID: me, name: "me", physicalClock: { 1_000 })
        state.apply(hostileDelta(counter: ValidationLimits.maxCounter))
        let before = state.records
        #expect {
            _ = try DataExchange.importData(Data(#"[{"id": "0F0E0D0C-0B0A-4909-8807-060504030201", "name": "Ward"}]"#.utf8), into: &state)
        } throws: { error in
            "\(error)".contains("last event counter")
        }
        #expect(state.records == before)
    }

    @Test("export writes non-finite numbers as strings instead of failing")
    func exportNonFinite() throws {
        var state = ReplicaState(replicaID: me, name: "me", physicalClock: { 1_000 })
        let id = UUID()
        state.write(["symbol": "N", "title": "Broken", "description": "", "duration": .double(.nan), "locationID": .null],
                    to: RecordKey(collection: ShiftType.collection, id: id))
        state.setSetting("ratio", to: .double(-.infinity), scope: .synced)
        let text = String(decoding: try DataExchange.exportData(state), as: UTF8.self)
        #expect(text.contains(#""duration" : "NaN""#) && text.contains(#""ratio" : "-Infinity""#), "\(text)")
        // A stored NaN duration decodes (readers show it as invalid); it does not trap.
        #expect(try state.fetch(ShiftType.self, id: id)?.duration.isNaN == true)
    }

    struct Counts: SyncRecord, Equatable {
        static let collection = "counts"
        var id: UUID
        var small: Int8
        var count: Int
        var ratio: Float
    }

    @Test("decoding numbers into typed records never traps: out of range, NaN and infinity are errors")
    func fieldDecoderRanges() throws {
        let decoder = FieldDecoder()
        let id = FieldValue.string(UUID().uuidString)
        func decode(_ small: FieldValue, _ count: FieldValue, _ ratio: FieldValue = .double(1)) throws -> Counts {
            try decoder.decode(Counts.self, fromFields: ["id": id, "small": small, "count": count, "ratio": ratio])
        }
        #expect(try decode(.int(5), .double(7)).count == 7)
        for (small, count) in [(FieldValue.int(300), FieldValue.int(1)), (.int(1), .double(.nan)), (.int(1), .double(.infinity)),
                               (.int(1), .double(1e300)), (.int(1), .double(2.5)), (.double(-129), .int(1)), (.int(1), .double(9.3e18))] {
            #expect(throws: DecodingError.self, "\(small) \(count)") { _ = try decode(small, count) }
        }
        #expect(try decode(.int(1), .int(1), .double(1e300)).ratio == .infinity)
    }
}
