@_spi(Engine) import PeerSyncCRDT
import PeerSyncTestSupport
@testable import PeerSyncWire
import Testing

@Suite("Frames and messages", .computeLane)
struct WireTests {
    static func sampleMessages(_ rng: inout SeededGenerator) -> [Message] {
        let context = CausalContext(dots: (0..<5).map { _ in Dot(replica: testReplica(Int.random(in: 0..<3, using: &rng)), counter: UInt64.random(in: 1...30, using: &rng)) })
        return [
            .hello(Hello(replicaID: testReplica(1), name: "laptop", wallClockMilliseconds: 1_700_000_000_000,
                         context: context, digest: StateDigest(high: rng.next(), low: rng.next()))),
            .chunk(index: 0, count: 2, records: 3, delta: [0, 1, 2]),
            .delta([1, 2, 3, 4]),
            .ack(context, neighbors: nil),
            .ack(context, neighbors: [testReplica(4), testReplica(5)]),
            .ack(context, neighbors: nil, incremental: true),
            .digest(StateDigest(high: 1, low: 2), records: 99),
            .ping(rng.next()),
            .pong(7),
            .goodbye(.shuttingDown, "bye"),
            .error(.clockSkew, "too far"),
        ]
    }

    @Test("every message round-trips through frames fed one byte at a time")
    func byteAtATime() throws {
        var rng = SeededGenerator(seed: baseSeed)
        let messages = Self.sampleMessages(&rng)
        var splitter = FrameSplitter()
        var decoded: [Message] = []
        for byte in messages.flatMap({ $0.encodedFrame() }) {
            splitter.append([byte])
            while let (type, body) = try splitter.next() { decoded.append(try Message.decode(type: type, body: body)) }
        }
        #expect(decoded == messages)
    }

    @Test("a length over the limit is refused before the body arrives")
    func oversized() {
        var splitter = FrameSplitter(maxFrameBytes: 1_000)
        var header: [UInt8] = []
        Varint.append(1_001, to: &header)
        splitter.append(header)
        #expect(throws: WireError.frameTooLarge(length: 1_001, limit: 1_000)) { _ = try splitter.next() }
        var huge = FrameSplitter(maxFrameBytes: 1_000)
        huge.append([0xff, 0xff, 0xff])  // incomplete varint already over the limit
        #expect(throws: WireError.self) { _ = try huge.next() }
        var empty = FrameSplitter()
        empty.append([0])
        #expect(throws: WireError.emptyFrame) { _ = try empty.next() }
    }

    @Test("unknown message types and malformed bodies are errors, unknown fields are skipped")
    func forwardCompatibility() throws {
        #expect(throws: WireError.unknownMessageType(42)) { _ = try Message.decode(type: 42, body: []) }
        #expect(throws: WireError.self) { _ = try Message.decode(type: Message.Kind.hello.rawValue, body: [0x0a, 0xff]) }
        // A ping from a newer peer with an extra field 9 (bytes) and 10 (fixed64) decodes.
        var body = Message.ping(5).body()
        body += [9 << 3 | 2, 3, 1, 2, 3]
        body += [10 << 3 | 1] + [UInt8](repeating: 0, count: 8)
        #expect(try Message.decode(type: Message.Kind.ping.rawValue, body: body) == .ping(5))
        // A hello without a required field names the field.
        #expect {
            _ = try Message.decode(type: Message.Kind.hello.rawValue, body: [])
        } throws: { error in
            "\(error)".hasPrefix("hello lacks required field")
        }
    }

    @Test("session-encoded deltas round-trip; the dictionary makes repeats small")
    func wireDeltas() throws {
        let scenario = Scenarios.recordMap()
        let sender = WireDictionary(startingAt: 1_000)
        let receiver = WireDictionary(startingAt: 1_000)
        for index in 0..<UInt64(300) {
            var rng = SeededGenerator(seed: baseSeed &+ index)
            for state in scenario.randomReplicas(&rng) {
                let decoded = try WireDelta.decode(WireDelta.encode(state, with: sender), with: receiver)
                #expect(decoded == state, "seed \(baseSeed &+ index)")
            }
        }
    }

    @Test("a one-field update is at most 40 bytes on the wire (frame included)")
    func deltaBudget() throws {
        var map = RecordMap()
        var clock = HybridLogicalClock(physicalClock: { 1_700_000_000_000 })
        let sender = WireDictionary(startingAt: 1_700_000_000_000)
        let keys = (0..<100).map { _ in RecordKey(collection: "shiftTypes", id: UUID()) }
        for key in keys {
            let delta = try map.write(["symbol": "E", "title": "Early shift", "duration": 28_800, "description": "6 to 14"],
                                  to: key, at: clock.tick(), by: testReplica(0))
            _ = WireDelta.encode(delta, with: sender)
        }
        let later = HybridLogicalClock(latest: clock.latest, physicalClock: { 1_700_000_060_000 })
        clock = later
        var sizes: [Int] = []
        for key in keys {
            let delta = try map.write(["duration": 30_600], to: key, at: clock.tick(), by: testReplica(0))
            sizes.append(Message.delta(WireDelta.encode(delta, with: sender)).encodedFrame().count)
        }
        #expect(sizes.max()! <= 40, "sizes \(Set(sizes))")
    }

    @Test("random bytes never crash the decoders")
    func randomBytes() {
        var rng = SeededGenerator(seed: baseSeed)
        for _ in 0..<5_000 {
            let bytes = (0..<Int.random(in: 0..<64, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            var splitter = FrameSplitter(maxFrameBytes: 4_096)
            splitter.append(bytes)
            while let frame = try? splitter.next() {
                _ = try? Message.decode(type: frame.type, body: frame.body)
            }
            _ = try? WireDelta.decode(bytes, with: WireDictionary(startingAt: 0))
        }
    }
}
