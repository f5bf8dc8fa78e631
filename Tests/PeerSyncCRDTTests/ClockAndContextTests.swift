@_spi(Engine) import PeerSyncCRDT
import PeerSyncTestSupport
import Testing

@Suite("Hybrid logical clock")
struct HybridLogicalClockTests {
    @Test("ticks strictly increase with a frozen wall clock")
    func monotonicWhenFrozen() {
        var clock = HybridLogicalClock(physicalClock: { 42 })
        let first = clock.tick()
        let second = clock.tick()
        #expect(second > first)
        #expect(second.physicalMilliseconds == 42 && second.logical == 1)
    }

    @Test("follows the wall clock when it moves ahead")
    func followsWallClock() {
        var clock = HybridLogicalClock(latest: HLCTimestamp(physicalMilliseconds: 10, logical: 9), physicalClock: { 500 })
        #expect(clock.tick() == HLCTimestamp(physicalMilliseconds: 500, logical: 0))
    }

    @Test("after observing a remote timestamp, the next tick is greater")
    func observeThenTick() {
        var clock = HybridLogicalClock(physicalClock: { 1 })
        let remote = HLCTimestamp(physicalMilliseconds: 9_999, logical: 7)
        clock.observe(remote)
        #expect(clock.tick() > remote)
    }

    @Test("logical overflow carries into the physical part")
    func logicalOverflow() {
        var clock = HybridLogicalClock(latest: HLCTimestamp(physicalMilliseconds: 5, logical: .max), physicalClock: { 5 })
        #expect(clock.tick() == HLCTimestamp(physicalMilliseconds: 6, logical: 0))
    }

    @Test("the packed form orders like (physical, logical)")
    func packing() {
        let t = HLCTimestamp(physicalMilliseconds: 1_700_000_000_000, logical: 3)
        #expect(t.physicalMilliseconds == 1_700_000_000_000 && t.logical == 3)
        #expect(t < HLCTimestamp(physicalMilliseconds: 1_700_000_000_000, logical: 4))
        #expect(HLCTimestamp(physicalMilliseconds: 1_700_000_000_000, logical: .max) < HLCTimestamp(physicalMilliseconds: 1_700_000_000_001, logical: 0))
    }
}

@Suite("Causal context")
struct CausalContextTests {
    let r = testReplica(0)

    @Test("out-of-order dots wait in the cloud and compact when the gap fills")
    func compaction() {
        var context = CausalContext()
        context.insert(Dot(replica: r, counter: 3))
        context.insert(Dot(replica: r, counter: 2))
        #expect(context.cloudDotCount == 2)
        #expect(context.contiguousCounter(of: r) == 0)
        context.insert(Dot(replica: r, counter: 1))
        #expect(context.cloudDotCount == 0)
        #expect(context.contiguousCounter(of: r) == 3)
        #expect(context == CausalContext(versionVector: [r: 3]))
    }

    @Test("the representation is canonical: same dots, equal values")
    func canonical() {
        var rng = SeededGenerator(seed: baseSeed)
        for _ in 0..<200 {
            let dots = (0..<20).map { _ in Dot(replica: testReplica(Int.random(in: 0..<2, using: &rng)), counter: UInt64.random(in: 1...15, using: &rng)) }
            #expect(CausalContext(dots: dots) == CausalContext(dots: dots.shuffled(using: &rng)))
        }
    }

    @Test("causal relations")
    func relations() {
        let small = CausalContext(versionVector: [r: 2])
        let big = CausalContext(versionVector: [r: 5])
        let other = CausalContext(versionVector: [testReplica(1): 1])
        #expect(small.causalRelation(to: big) == .happenedBefore)
        #expect(big.causalRelation(to: small) == .happenedAfter)
        #expect(small.causalRelation(to: other) == .concurrent)
        #expect(big.causalRelation(to: big) == .equal)
        #expect(big.includes(CausalContext(dots: [Dot(replica: r, counter: 4)])))
    }

    @Test("replica IDs print and parse as 32 hex digits")
    func replicaIDText() {
        var rng = SeededGenerator(seed: baseSeed)
        for _ in 0..<100 {
            let id = ReplicaID.random(using: &rng)
            #expect(id.description.count == 32)
            #expect(ReplicaID(hex: id.description) == id)
        }
        #expect(ReplicaID(hex: "xyz") == nil)
    }
}

@Suite("Field values")
struct FieldValueTests {
    static func random(_ rng: inout SeededGenerator, depth: Int = 0) -> FieldValue {
        switch Int.random(in: 0..<(depth < 3 ? 10 : 8), using: &rng) {
        case 9: return .uuid(UUID(uuid: (UInt8.random(in: 0...255, using: &rng), 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, UInt8.random(in: 0...255, using: &rng))))
        case 0: return .null
        case 1: return .bool(rng.chance(0.5))
        case 2: return .int(Int64.random(in: .min ... .max, using: &rng))
        case 3: return .double(Double(bitPattern: rng.next()))
        case 4: return .string(String((0..<Int.random(in: 0..<12, using: &rng)).map { _ in "aé€😀z".randomElement(using: &rng)! }))
        case 5: return .bytes((0..<Int.random(in: 0..<10, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) })
        case 6: return .int(Int64.random(in: -3...3, using: &rng))
        case 7: return .list((0..<Int.random(in: 0..<4, using: &rng)).map { _ in random(&rng, depth: depth + 1) })
        default:
            var map: [String: FieldValue] = [:]
            for i in 0..<Int.random(in: 0..<4, using: &rng) { map["k\(i)"] = random(&rng, depth: depth + 1) }
            return .map(map)
        }
    }

    @Test("canonical encoding round-trips")
    func roundTrip() throws {
        var rng = SeededGenerator(seed: baseSeed)
        for _ in 0..<2_000 {
            let value = Self.random(&rng)
            #expect(try FieldValue(decoding: value.encoded) == value)
        }
    }

    @Test("truncated and garbage bytes are refused with a reason, never a crash")
    func garbage() {
        var rng = SeededGenerator(seed: baseSeed)
        var refused = 0
        for _ in 0..<2_000 {
            var bytes = Self.random(&rng).encoded
            if bytes.count > 1, rng.chance(0.5) { bytes.removeLast(Int.random(in: 1..<bytes.count, using: &rng)) }
            else { bytes[Int.random(in: 0..<bytes.count, using: &rng)] = UInt8.random(in: 0...255, using: &rng) }
            do { _ = try FieldValue(decoding: bytes) } catch { refused += 1 }
        }
        #expect(refused > 500)
        #expect(throws: FieldValueDecodingError.unknownTag(99)) { try FieldValue(decoding: [99]) }
        #expect(throws: FieldValueDecodingError.tooDeep) { try FieldValue(decoding: [UInt8](repeating: 7, count: 200) + [0]) }
    }
}
