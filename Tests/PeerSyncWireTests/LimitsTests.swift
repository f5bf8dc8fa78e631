@_spi(Engine) import PeerSyncCRDT
import PeerSyncTestSupport
@testable import PeerSyncWire
import Testing

@Suite("Validation limits on the wire", .computeLane)
struct WireLimitsTests {
    static let invalidCounters: [UInt64] = [0, ValidationLimits.maxCounter + 1, 1 << 63, .max]
    static let validCounters: [UInt64] = [1, ValidationLimits.maxCounter]
    static let now: UInt64 = 1_700_000_000_000

    let me = testReplica(0)
    let other = testReplica(1)
    let third = testReplica(2)
    let key = RecordKey(collection: "shiftTypes", id: UUID())
    let time = HLCTimestamp(physicalMilliseconds: WireLimitsTests.now, logical: 0)

    /// Encodes `delta` and decodes it with a fresh pair of session dictionaries.
    func roundTrip(_ delta: RecordMap) throws(WireError) -> RecordMap {
        try WireDelta.decode(WireDelta.encode(delta, with: WireDictionary(startingAt: Self.now)), with: WireDictionary(startingAt: Self.now))
    }

    func map(_ state: RecordState, context: CausalContext = CausalContext()) -> RecordMap {
        RecordMap(records: [(key, state)], context: context, maintainingDigest: false)
    }

    /// Deltas with `counter` in each counter position of the session encoding (§5), by name.
    func deltas(with counter: UInt64) -> [(String, RecordMap)] {
        let dot = Dot(replica: other, counter: counter)
        let shared = Dot(replica: me, counter: 5)
        func field(_ dot: Dot, _ value: FieldValue = "v") -> FieldRegister {
            FieldRegister(value: value, timestamp: time, dot: dot, supersedes: .zero)
        }
        var cases: [(String, RecordMap)] = [
            // One local write: the event form (§5.1).
            ("event counter", map(RecordState(fields: ["a": field(dot)], presence: [other: PresenceEntry(counter: counter, removedBy: nil)]),
                                  context: CausalContext(dots: [dot]))),
            // No context (as in a catch-up chunk): the general form; the record's base dot has the counter.
            ("base counter", map(RecordState(fields: ["a": field(dot)], presence: [other: PresenceEntry(counter: counter, removedBy: nil)]))),
            // Two fields share the base dot; the third has its own.
            ("field dot", map(RecordState(fields: ["a": field(shared), "b": field(shared, 2), "c": field(dot)],
                                          presence: [me: PresenceEntry(counter: 5, removedBy: nil)]))),
            ("presence counter", map(RecordState(fields: ["a": field(shared)],
                                                 presence: [me: PresenceEntry(counter: 5, removedBy: nil), other: PresenceEntry(counter: counter, removedBy: nil)]))),
            ("remover counter", map(RecordState(presence: [me: PresenceEntry(counter: 5, removedBy: dot)]))),
        ]
        if counter > 0 {  // a context cannot hold counter 0
            cases.append(("context vector", map(RecordState(fields: ["a": field(shared)], presence: [me: PresenceEntry(counter: 5, removedBy: nil)]),
                                                context: CausalContext(versionVector: [me: 5, other: counter]))))
            cases.append(("context cloud", map(RecordState(fields: ["a": field(shared)], presence: [me: PresenceEntry(counter: 5, removedBy: nil)]),
                                               context: CausalContext(dots: [Dot(replica: me, counter: 5), Dot(replica: third, counter: 1), Dot(replica: third, counter: counter)]))))
        }
        return cases
    }

    @Test("counters 0, 2⁵³+1, 2⁶³, 2⁶⁴−1 are malformed in every position of a delta; 1 and 2⁵³ decode")
    func deltaCounters() throws {
        for counter in Self.invalidCounters {
            for (position, delta) in deltas(with: counter) {
                #expect(throws: WireError.self, "\(position) \(counter)") { _ = try roundTrip(delta) }
                do {
                    _ = try roundTrip(delta)
                } catch {
                    guard case .malformed(_, let detail) = error else { Issue.record("\(position): \(error)"); continue }
                    #expect(detail.contains("counter") || detail.contains("context"), "\(position) \(counter): \(detail)")
                }
            }
        }
        for counter in Self.validCounters {
            for (position, delta) in deltas(with: counter) {
                #expect(try roundTrip(delta) == delta, "\(position) \(counter)")
            }
        }
        // The event form really is used for the first case (a counter of 1 joins the context's
        // vector, not its cloud, so that delta goes in the general form).
        #expect(WireDelta.encode(deltas(with: ValidationLimits.maxCounter)[0].1, with: WireDictionary(startingAt: Self.now)).first == 1)
        #expect(WireDelta.encode(deltas(with: .max)[0].1, with: WireDictionary(startingAt: Self.now)).first == 1)
        #expect(WireDelta.encode(deltas(with: ValidationLimits.maxCounter)[1].1, with: WireDictionary(startingAt: Self.now)).first == 0)
    }

    @Test("hello and ack contexts: counters above 2⁵³ are malformed")
    func messageContextCounters() throws {
        for counter in Self.invalidCounters where counter > 0 {
            for context in [CausalContext(versionVector: [other: counter]),
                            CausalContext(dots: [Dot(replica: other, counter: 1), Dot(replica: other, counter: counter)])] {
                let hello = Message.hello(Hello(replicaID: me, name: "x", wallClockMilliseconds: Self.now, context: context, digest: .empty))
                #expect(throws: WireError.self) { _ = try Message.decode(type: 1, body: hello.body()) }
                let ack = Message.ack(context, neighbors: nil)
                #expect(throws: WireError.self) { _ = try Message.decode(type: 4, body: ack.body()) }
            }
        }
        let edge = CausalContext(dots: [Dot(replica: other, counter: ValidationLimits.maxCounter), Dot(replica: me, counter: 1)])
        let ack = Message.ack(edge, neighbors: [third])
        #expect(try Message.decode(type: 4, body: ack.body()) == ack)
    }

    @Test("timestamps after the year 9999 are malformed in the event and the general form")
    func timestamps() throws {
        let late = HLCTimestamp(physicalMilliseconds: ValidationLimits.maxPhysicalMilliseconds + 1, logical: 0)
        let dot = Dot(replica: other, counter: 3)
        let register = FieldRegister(value: 1, timestamp: late, dot: dot, supersedes: time)
        let event = map(RecordState(fields: ["a": register], presence: [other: PresenceEntry(counter: 3, removedBy: nil)]),
                        context: CausalContext(dots: [dot]))
        #expect(throws: WireError.self) { _ = try roundTrip(event) }
        let general = map(RecordState(fields: ["a": register], presence: [other: PresenceEntry(counter: 3, removedBy: nil)]))
        #expect(throws: WireError.self) { _ = try roundTrip(general) }
        let shared = FieldRegister(value: 1, timestamp: time, dot: dot, supersedes: .zero)
        let ownTime = map(RecordState(fields: ["a": shared, "b": shared, "c": register], presence: [other: PresenceEntry(counter: 3, removedBy: nil)]))
        #expect(throws: WireError.self) { _ = try roundTrip(ownTime) }
        let last = FieldRegister(value: 1, timestamp: ValidationLimits.maxTimestamp, dot: dot, supersedes: time)
        let valid = map(RecordState(fields: ["a": last], presence: [other: PresenceEntry(counter: 3, removedBy: nil)]))
        #expect(try roundTrip(valid) == valid)
    }

    @Test("chunk headers: records 2⁶³, count 2⁶³ and count 2³²+1 are malformed")
    func chunkHeaders() throws {
        let payload: [UInt8] = [0, 0, 0]  // general form, empty context, no collections
        func decode(_ index: UInt64, _ count: UInt64, _ records: UInt64) throws -> Message {
            try Message.decode(type: 2, body: Message.chunk(index: index, count: count, records: records, delta: payload).body())
        }
        #expect(throws: WireError.self) { _ = try decode(0, 1, 1 << 63) }
        #expect(throws: WireError.self) { _ = try decode(0, 1, .max) }
        #expect(throws: WireError.self) { _ = try decode(0, 1, 4) }
        #expect(throws: WireError.self) { _ = try decode(0, 1 << 63, 0) }
        #expect(throws: WireError.self) { _ = try decode(1 << 32, (1 << 32) + 1, 0) }
        #expect(throws: WireError.self) { _ = try decode(5, 5, 0) }
        #expect(try decode((1 << 32) - 1, 1 << 32, 3) == .chunk(index: (1 << 32) - 1, count: 1 << 32, records: 3, delta: payload))
    }

    @Test("contexts over the limits are malformed in hellos, acks and deltas, and refused before they are built")
    func contextSizes() throws {
        let hello100k = [UInt8]([1 << 3 | 2]) + lengthPrefixed(rawContextBlob(replicas: 100_000, contiguous: 2, cloudPerReplica: 0))
        #expect(throws: WireError.self) { _ = try Message.decode(type: 1, body: hello100k) }
        let ackMillion = [UInt8]([1 << 3 | 2]) + lengthPrefixed(rawContextBlob(replicas: 1, contiguous: 1, cloudPerReplica: 1_000_000))
        #expect(throws: WireError.self) { _ = try Message.decode(type: 4, body: ackMillion) }
        // Issue 17's stall: a ~950 KB delta whose context names 50,000 replica IDs.
        var vector: [ReplicaID: UInt64] = [:]
        for i in 0..<50_000 { vector[ReplicaID(high: 0xABC, low: UInt64(i))] = UInt64(i % 1_000 + 1) }
        let wide = WireDelta.encode(records: [(RecordKey, RecordState)](), context: CausalContext(versionVector: vector),
                                    with: WireDictionary(startingAt: Self.now))
        #expect(wide.count > 900_000)
        #expect(throws: WireError.self) { _ = try WireDelta.decode(wide, with: WireDictionary(startingAt: Self.now)) }
        // 1,000,000 cloud dots in a delta's context.
        let cloudy = CausalContext(dots: (0..<(ValidationLimits.maxCloudDots + 1)).map { Dot(replica: other, counter: UInt64(2 * $0 + 2)) })
        let cloudyDelta = WireDelta.encode(records: [(RecordKey, RecordState)](), context: cloudy, with: WireDictionary(startingAt: Self.now))
        #expect(throws: WireError.self) { _ = try WireDelta.decode(cloudyDelta, with: WireDictionary(startingAt: Self.now)) }
    }

    @Test("frames of the largest allowed shapes decode correctly")
    func largestFrames() throws {
        // A hello and an ack naming 10,000 replicas (the limit), the ack with 4,096 neighbours.
        var vector: [ReplicaID: UInt64] = [:]
        for i in 0..<ValidationLimits.maxContextReplicas { vector[ReplicaID(high: 0xABC, low: UInt64(i))] = ValidationLimits.maxCounter - UInt64(i) }
        let context = CausalContext(versionVector: vector)
        let hello = Message.hello(Hello(replicaID: me, name: String(repeating: "n", count: 1_000), wallClockMilliseconds: Self.now,
                                        context: context, digest: StateDigest(high: 1, low: 2)))
        let ack = Message.ack(context, neighbors: (0..<4_096).map { ReplicaID(high: 9, low: UInt64($0)) })
        for message in [hello, ack] {
            let frame = message.encodedFrame()
            #expect(frame.count < WireLimits.defaultMaxFrameBytes)
            var splitter = FrameSplitter()
            splitter.append(frame)
            let (type, body) = try #require(try splitter.next())
            #expect(try Message.decode(type: type, body: body) == message)
        }
        // A chunk of almost 4 MiB of records.
        var state = RecordMap()
        var clock = HybridLogicalClock(physicalClock: { Self.now })
        for i in 0..<45_000 {
            try state.write(["symbol": "E", "title": .string("Shift type \(i)"), "duration": 28_800,
                             "description": .string(String(repeating: "d", count: 40))],
                            to: RecordKey(collection: "shiftTypes", id: UUID()), at: clock.tick(), by: testReplica(i % 7))
        }
        var records = state.allRecords
        var payload = WireDelta.encode(records: records, context: state.context, with: WireDictionary(startingAt: Self.now))
        if payload.count > 4_150_000 {
            records = Array(records.prefix(records.count * 4_100_000 / payload.count))
            payload = WireDelta.encode(records: records, context: state.context, with: WireDictionary(startingAt: Self.now))
        }
        let chunk = Message.chunk(index: 0, count: 1, records: UInt64(records.count), delta: payload)
        let frame = chunk.encodedFrame()
        #expect(frame.count > 3_000_000 && frame.count <= WireLimits.defaultMaxFrameBytes, "\(frame.count) bytes")
        var splitter = FrameSplitter()
        splitter.append(frame)
        let (type, body) = try #require(try splitter.next())
        guard case .chunk(_, _, let count, let delta, _) = try Message.decode(type: type, body: body) else {
            Issue.record("not a chunk")
            return
        }
        #expect(count == UInt64(records.count))
        let expected = RecordMap(records: records, context: state.context, maintainingDigest: false)
        #expect(try WireDelta.decode(delta, with: WireDictionary(startingAt: Self.now)) == expected)
    }
}

func lengthPrefixed(_ bytes: [UInt8]) -> [UInt8] {
    var out: [UInt8] = []
    Varint.append(UInt64(bytes.count), to: &out)
    return out + bytes
}

