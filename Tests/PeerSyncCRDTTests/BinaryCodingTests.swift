@_spi(Engine) import PeerSyncCRDT
import PeerSyncTestSupport
import Testing

@Suite("Binary coding", .computeLane)
struct BinaryCodingTests {
    @Test("record maps, records and contexts round-trip")
    func roundTrip() throws {
        let scenario = Scenarios.recordMap()
        for index in 0..<UInt64(300) {
            var rng = SeededGenerator(seed: baseSeed &+ index)
            for state in scenario.randomReplicas(&rng) {
                let decoded = try RecordMap(decoding: state.encoded())
                #expect(decoded == state && decoded.digest == state.digest, "seed \(baseSeed &+ index)")
                #expect(try CausalContext(blob: state.context.encodedBlob()) == state.context)
                for (_, record) in state.allRecords {
                    #expect(try RecordState(blob: record.encodedBlob()) == record)
                }
            }
        }
    }

    @Test("random corruption is refused or decodes to a state that still obeys the laws")
    func corruption() {
        let scenario = Scenarios.recordMap()
        var refused = 0
        for index in 0..<UInt64(2_000) {
            var rng = SeededGenerator(seed: baseSeed &+ index)
            let state = scenario.randomReplicas(&rng)[0]
            var bytes = state.encoded()
            switch Int.random(in: 0..<3, using: &rng) {
            case 0: bytes.removeLast(Int.random(in: 1...bytes.count, using: &rng))
            case 1: bytes[Int.random(in: 0..<bytes.count, using: &rng)] ^= UInt8.random(in: 1...255, using: &rng)
            default: bytes.insert(UInt8.random(in: 0...255, using: &rng), at: Int.random(in: 0...bytes.count, using: &rng))
            }
            do {
                let decoded = try RecordMap(decoding: bytes)
                // Whatever decodes is a valid state: joining is still idempotent and commutative.
                #expect(decoded.merged(with: decoded) == decoded)
                #expect(decoded.merged(with: state) == state.merged(with: decoded))
            } catch {
                refused += 1
            }
        }
        #expect(refused > 1_000)
    }

    @Test("a one-field update delta is small")
    func deltaSize() throws {
        var map = RecordMap()
        let key = RecordKey(collection: "shiftTypes", id: UUID())
        var clock = HybridLogicalClock()
        try map.write(["symbol": "E", "title": "Early", "duration": 28_800], to: key, at: clock.tick(), by: testReplica(0))
        let delta = try map.write(["duration": 30_000], to: key, at: clock.tick(), by: testReplica(0))
        // Self-contained form (journal): 16-byte replica table, context, collection and field
        // names, 16-byte record UUID, the register and presence entry. The wire form interns
        // replica IDs and names per session and is smaller.
        #expect(delta.encoded().count < 100)
    }
}
