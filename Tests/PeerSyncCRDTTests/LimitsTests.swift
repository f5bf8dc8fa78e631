@_spi(Engine) import PeerSyncCRDT
import PeerSyncTestSupport
import Testing

/// Counter values every decoder must refuse (0 and above 2⁵³), and the valid extremes.
let invalidCounters: [UInt64] = [0, ValidationLimits.maxCounter + 1, 1 << 63, .max]
let validCounters: [UInt64] = [1, ValidationLimits.maxCounter]


@Suite("Validation limits: store blobs and CRDT operations")
struct LimitsTests {
    let me = testReplica(0)
    let other = testReplica(1)
    let key = RecordKey(collection: "shiftTypes", id: UUID())
    let time = HLCTimestamp(physicalMilliseconds: 1_700_000_000_000, logical: 0)

    func register(counter: UInt64, by writer: ReplicaID? = nil) -> FieldRegister {
        FieldRegister(value: "v", timestamp: time, dot: Dot(replica: writer ?? other, counter: counter), supersedes: .zero)
    }

    /// Records with `counter` in each counter position of the record encoding.
    func records(with counter: UInt64) -> [(String, RecordState)] {
        [
            ("field dot", RecordState(fields: ["f": register(counter: counter)], presence: [other: PresenceEntry(counter: 1, removedBy: nil)])),
            ("presence", RecordState(fields: ["f": register(counter: 1)], presence: [other: PresenceEntry(counter: counter, removedBy: nil)])),
            ("remover", RecordState(presence: [other: PresenceEntry(counter: 1, removedBy: Dot(replica: me, counter: counter))])),
        ]
    }

    @Test("record blobs: counters 0, 2⁵³+1, 2⁶³, 2⁶⁴−1 are refused in every position; 1 and 2⁵³ read back")
    func recordBlobCounters() throws {
        for counter in invalidCounters {
            for (position, state) in records(with: counter) {
                #expect(state.limitViolation != nil, "\(position) \(counter)")
                #expect(throws: BinaryDecodingError.self, "\(position) \(counter)") { _ = try RecordState(blob: state.encodedBlob()) }
                let map = RecordMap(records: [(key, state)], context: CausalContext(), maintainingDigest: false)
                #expect(throws: BinaryDecodingError.self, "journal \(position) \(counter)") { _ = try RecordMap(decoding: map.encoded()) }
            }
        }
        for counter in validCounters {
            for (position, state) in records(with: counter) {
                #expect(state.limitViolation == nil, "\(position) \(counter)")
                #expect(try RecordState(blob: state.encodedBlob()) == state, "\(position) \(counter)")
            }
        }
    }

    @Test("context blobs: counters above 2⁵³ in the vector or the cloud are refused")
    func contextBlobCounters() throws {
        for counter in invalidCounters where counter > 0 {
            let vector = CausalContext(versionVector: [other: counter])
            let cloud = CausalContext(dots: [Dot(replica: other, counter: 1), Dot(replica: other, counter: counter)])
            for context in [vector, cloud] {
                #expect(context.limitViolation != nil)
                #expect(throws: BinaryDecodingError.self, "\(counter)") { _ = try CausalContext(blob: context.encodedBlob()) }
                let map = RecordMap(records: [(RecordKey, RecordState)](), context: context, maintainingDigest: false)
                #expect(throws: BinaryDecodingError.self, "journal \(counter)") { _ = try RecordMap(decoding: map.encoded()) }
            }
        }
        let extreme = CausalContext(dots: [Dot(replica: other, counter: 1), Dot(replica: other, counter: ValidationLimits.maxCounter),
                                           Dot(replica: me, counter: ValidationLimits.maxCounter)])
        #expect(try CausalContext(blob: extreme.encodedBlob()) == extreme)
        // A gap that would carry a cloud counter past the limit (or wrap) is refused too.
        var bytes = rawContextBlob(replicas: 1, contiguous: ValidationLimits.maxCounter, cloudPerReplica: 1, gap: 1)
        #expect(throws: BinaryDecodingError.self) { _ = try CausalContext(blob: bytes) }
        bytes = rawContextBlob(replicas: 1, contiguous: 5, cloudPerReplica: 1, gap: .max)
        #expect(throws: BinaryDecodingError.self) { _ = try CausalContext(blob: bytes) }
    }

    @Test("timestamps after the year 9999 are refused in record blobs")
    func recordBlobTimestamps() throws {
        for raw in [ValidationLimits.maxTimestamp.rawValue + 1, .max] {
            let state = RecordState(fields: ["f": FieldRegister(value: 1, timestamp: HLCTimestamp(rawValue: raw), dot: Dot(replica: me, counter: 1),
                                                                  supersedes: .zero)])
            #expect(state.limitViolation != nil)
            #expect(throws: BinaryDecodingError.self) { _ = try RecordState(blob: state.encodedBlob()) }
        }
        let last = RecordState(fields: ["f": FieldRegister(value: 1, timestamp: ValidationLimits.maxTimestamp, dot: Dot(replica: me, counter: 1),
                                                             supersedes: time)])
        #expect(try RecordState(blob: last.encodedBlob()) == last)
    }

    @Test("contexts over the replica or cloud-dot limit are refused; at the limit they read back")
    func contextSizes() throws {
        #expect(throws: BinaryDecodingError.self) {
            _ = try CausalContext(blob: rawContextBlob(replicas: 100_000, contiguous: 3, cloudPerReplica: 0))
        }
        #expect(throws: BinaryDecodingError.self) {
            _ = try CausalContext(blob: rawContextBlob(replicas: 1, contiguous: 1, cloudPerReplica: 1_000_000))
        }
        #expect(throws: BinaryDecodingError.self) {
            _ = try CausalContext(blob: rawContextBlob(replicas: ValidationLimits.maxContextReplicas + 1, contiguous: 3, cloudPerReplica: 0))
        }
        // The cloud limit counts dots over all replicas.
        #expect(throws: BinaryDecodingError.self) {
            _ = try CausalContext(blob: rawContextBlob(replicas: 4, contiguous: 1, cloudPerReplica: ValidationLimits.maxCloudDots / 4 + 1))
        }
        let wide = try CausalContext(blob: rawContextBlob(replicas: ValidationLimits.maxContextReplicas, contiguous: 3, cloudPerReplica: 0))
        #expect(wide.replicaCount == ValidationLimits.maxContextReplicas && wide.limitViolation == nil)
        let cloudy = try CausalContext(blob: rawContextBlob(replicas: 4, contiguous: 1, cloudPerReplica: ValidationLimits.maxCloudDots / 4))
        #expect(cloudy.cloudDotCount == ValidationLimits.maxCloudDots && cloudy.limitViolation == nil)
        #expect(try CausalContext(blob: cloudy.encodedBlob()) == cloudy)
    }

    @Test("a decoded context is canonical even when its cloud continues the vector")
    func decodedCanonical() throws {
        // contiguous 2, cloud 3 4 6: 3 and 4 continue the vector.
        var bytes: [UInt8] = [1]
        other.appendBigEndianBytes(to: &bytes)
        bytes += [1, 0, 2, 3, 1, 1, 2]
        let context = try CausalContext(blob: bytes)
        #expect(context == CausalContext(dots: [1, 2, 3, 4, 6].map { Dot(replica: other, counter: $0) }))
        #expect(context.contiguousCounter(of: other) == 4 && context.cloudDotCount == 1)
    }

    @Test("nextDot at the counter limit throws instead of overflowing")
    func nextDotAtLimit() throws {
        var context = CausalContext(versionVector: [me: ValidationLimits.maxCounter - 1])
        #expect(try context.nextDot(for: me).counter == ValidationLimits.maxCounter)
        context.insert(Dot(replica: me, counter: ValidationLimits.maxCounter))
        #expect(throws: CounterExhaustedError(replica: me)) { _ = try context.nextDot(for: me) }
        #expect(!context.canTakeDot(for: me) && context.canTakeDot(for: other))
        // Values that never passed validation do not trap either.
        context.insert(Dot(replica: me, counter: .max))
        #expect(throws: CounterExhaustedError(replica: me)) { _ = try context.nextDot(for: me) }
        var set = ORSet<Int>()
        set.merge(ORSet())
        #expect(throws: Never.self) { try set.insert(1, by: me) }
    }

    @Test("issue 17: a dot of this replica at 2⁶⁴−1, then a context up to 2⁶⁴−2, never trap")
    func overflowScenarios() throws {
        // Scenario 1: one delta names the receiver with the last counter. (The decoders refuse
        // 2⁶⁴−1; this is the join of an unvalidated value, and of the largest valid one.)
        for counter in [UInt64.max, ValidationLimits.maxCounter] {
            var receiver = RecordMap()
            try receiver.write(["title": "mine"], to: key, at: time, by: me)
            var delta = RecordMap()
            let foreign = RecordState(fields: ["title": register(counter: counter, by: me)],
                                      presence: [me: PresenceEntry(counter: counter, removedBy: nil)])
            delta = RecordMap(records: [(key, foreign)], context: CausalContext(dots: [Dot(replica: me, counter: counter)]), maintainingDigest: false)
            receiver.apply(delta)
            #expect(throws: CounterExhaustedError(replica: me)) {
                try receiver.write(["title": "next"], to: key, at: HLCTimestamp(rawValue: time.rawValue + 5), by: me)
            }
            #expect(throws: CounterExhaustedError(replica: me)) { _ = try receiver.remove(key, by: me) }
            #expect(receiver.record(key)?.fields["title"]?.value == "v")  // unchanged by the refused write
            // After a restart (the state read back from its blob): the same clean refusal, or,
            // for a value past the limit, a refusal to read it at all.
            if counter == ValidationLimits.maxCounter {
                var restarted = try RecordMap(decoding: receiver.encoded())
                #expect(throws: CounterExhaustedError(replica: me)) {
                    try restarted.write(["title": "next"], to: key, at: HLCTimestamp(rawValue: time.rawValue + 5), by: me)
                }
            } else {
                #expect(throws: BinaryDecodingError.self) { _ = try RecordMap(decoding: receiver.encoded()) }
            }
        }
        // Scenario 2: a dot at 2⁶⁴−1 for some replica, then a context contiguous up to 2⁶⁴−2:
        // the compaction would step past 2⁶⁴−1.
        var context = CausalContext()
        context.merge(CausalContext(dots: [Dot(replica: other, counter: .max)]))
        context.merge(CausalContext(versionVector: [other: .max - 1]))
        #expect(context.contiguousCounter(of: other) == .max && context.cloudDotCount == 0)
        #expect(context.includes(CausalContext(versionVector: [other: .max])))
        var reverse = CausalContext(versionVector: [other: .max - 1])
        reverse.insert(Dot(replica: other, counter: .max))
        #expect(reverse == context)
        #expect(context.limitViolation != nil)
    }

    @Test("includes costs O(cloud), not O(counter): a vector entry of 2⁵³ against an empty context")
    func includesIsBounded() {
        let huge = CausalContext(versionVector: [other: ValidationLimits.maxCounter])
        #expect(!CausalContext().includes(huge))
        var cloudy = CausalContext(versionVector: [other: 1])
        for c in stride(from: UInt64(3), through: 2_001, by: 1) { cloudy.insert(Dot(replica: other, counter: c)) }
        #expect(!cloudy.includes(huge))
        #expect(!cloudy.includes(CausalContext(versionVector: [other: 2])))
        cloudy.insert(Dot(replica: other, counter: 2))
        #expect(cloudy.includes(CausalContext(versionVector: [other: 2_001])))
        #expect(!cloudy.includes(CausalContext(versionVector: [other: 2_002])))
    }

    @Test("includes and merge agree with plain set semantics on random contexts")
    func includesMatchesSets() {
        var rng = SeededGenerator(seed: baseSeed)
        for _ in 0..<2_000 {
            func random(_ rng: inout SeededGenerator) -> (CausalContext, Set<Dot>) {
                var dots = Set<Dot>()
                var context = CausalContext()
                for _ in 0..<Int.random(in: 0..<12, using: &rng) {
                    let replica = testReplica(Int.random(in: 0..<2, using: &rng))
                    if rng.chance(0.3) {
                        let top = UInt64.random(in: 1...8, using: &rng)
                        context.merge(CausalContext(versionVector: [replica: top]))
                        for c in 1...top { dots.insert(Dot(replica: replica, counter: c)) }
                    } else {
                        let dot = Dot(replica: replica, counter: UInt64.random(in: 1...12, using: &rng))
                        context.insert(dot)
                        dots.insert(dot)
                    }
                }
                return (context, dots)
            }
            let (a, aDots) = random(&rng)
            let (b, bDots) = random(&rng)
            #expect(a.includes(b) == aDots.isSuperset(of: bDots))
            #expect(a.merged(with: b) == CausalContext(dots: aDots.union(bDots)))
        }
    }

    @Test("interleaved clouds (odd counters against even ones) merge into one vector entry")
    func interleavedMerge() {
        let odds = CausalContext(dots: (0..<5_000).map { Dot(replica: other, counter: UInt64(2 * $0 + 3)) })
        let evens = CausalContext(dots: (0..<5_000).map { Dot(replica: other, counter: UInt64(2 * $0 + 2)) })
        var merged = odds.merged(with: evens)
        #expect(merged.contiguousCounter(of: other) == 0 && merged.cloudDotCount == 10_000)
        merged.insert(Dot(replica: other, counter: 1))
        #expect(merged == CausalContext(versionVector: [other: 10_001]))
        // A vector entry that jumps over part of a cloud drops what it covers.
        var jump = evens
        jump.merge(CausalContext(versionVector: [other: 5_000]))
        #expect(jump.contiguousCounter(of: other) == 5_000 && jump.cloudDotCount == 2_500)
    }

    @Test("the clock never passes the year 9999 and never traps")
    func clockAtTheEnd() {
        var clock = HybridLogicalClock(physicalClock: { 1_700_000_000_000 })
        clock.observe(ValidationLimits.maxTimestamp)
        #expect(clock.tick() == ValidationLimits.maxTimestamp)
        #expect(clock.tick() == ValidationLimits.maxTimestamp)
        var wild = HybridLogicalClock(latest: HLCTimestamp(rawValue: .max), physicalClock: { .max })
        #expect(wild.tick() <= ValidationLimits.maxTimestamp)
        var late = HybridLogicalClock(physicalClock: { .max })
        #expect(late.tick().physicalMilliseconds == ValidationLimits.maxPhysicalMilliseconds)
        var almost = HybridLogicalClock(latest: HLCTimestamp(physicalMilliseconds: ValidationLimits.maxPhysicalMilliseconds - 1, logical: .max),
                                        physicalClock: { 0 })
        #expect(almost.tick() == HLCTimestamp(physicalMilliseconds: ValidationLimits.maxPhysicalMilliseconds, logical: 0))
    }

    @Test("values: 63 levels of nesting read back, 64 do not; a map key twice is refused")
    func valueLimits() throws {
        func nested(_ levels: Int) -> FieldValue {
            var value = FieldValue.int(1)
            for _ in 0..<levels { value = .list([value]) }
            return value
        }
        #expect(try FieldValue(decoding: nested(63).encoded) == nested(63))
        #expect(!nested(63).isNested(deeperThan: ValidationLimits.maxValueDepth - 1))
        #expect(throws: FieldValueDecodingError.tooDeep) { _ = try FieldValue(decoding: nested(64).encoded) }
        #expect(nested(64).isNested(deeperThan: ValidationLimits.maxValueDepth - 1))
        #expect(!FieldValue.list([]).isNested(deeperThan: 0) && FieldValue.list([1]).isNested(deeperThan: 0))
        // map of two entries, both with key "k"
        let twice: [UInt8] = [8, 2, 1, 0x6B, 0, 1, 0x6B, 0]
        #expect(throws: FieldValueDecodingError.duplicateKey("k")) { _ = try FieldValue(decoding: twice) }
    }

    @Test("a write at a time not after the replaced value records that it superseded nothing")
    func writeAtAnOldTime() throws {
        var map = RecordMap()
        try map.write(["f": 1], to: key, at: time, by: me)
        let delta = try map.write(["f": 2], to: key, at: time, by: other)
        let register = try #require(delta.record(key)?.fields["f"])
        #expect(register.supersedes == .zero && register.limitViolation == nil)
        #expect(try RecordMap(decoding: map.encoded()) == map)
    }
}
