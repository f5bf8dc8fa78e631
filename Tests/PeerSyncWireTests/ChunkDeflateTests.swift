import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncTestSupport
@testable import PeerSyncWire
import Testing

@Suite("Deflated catch-up chunks")
struct ChunkDeflateTests {
    static let now: UInt64 = 1_700_000_000_000

    /// A catch-up chunk's delta: `count` records as a round encodes them.
    static func chunkDelta(records count: Int) throws -> (records: Int, bytes: [UInt8]) {
        var state = RecordMap()
        var clock = HybridLogicalClock(physicalClock: { now })
        for i in 0..<count {
            try state.write(["symbol": "E", "title": .string("Shift type \(i)"), "duration": .int(Int64(28_800 + i % 4 * 3_600)),
                             "description": .string("Covers ward \(i % 40) with handover at the start.")],
                            to: RecordKey(collection: "shiftTypes", id: UUID()), at: clock.tick(), by: testReplica(i % 3))
        }
        return (count, WireDelta.encode(records: state.allRecords, context: state.context, with: WireDictionary(startingAt: now)))
    }

    /// A chunk frame with any fields (field 5 = the declared inflated length).
    static func chunkFrame(delta: [UInt8], inflatedLength: UInt64?, records: UInt64 = 1) -> (type: UInt8, body: [UInt8]) {
        var w = FieldWriter()
        w.varint(1, 0)
        w.varint(2, 1)
        w.varint(3, records)
        w.bytes(4, delta)
        if let inflatedLength { w.varint(5, inflatedLength) }
        return (Message.Kind.chunk.rawValue, w.bytes)
    }

    static func decodeFrame(_ frame: [UInt8]) throws -> Message {
        var splitter = FrameSplitter()
        splitter.append(frame)
        let (type, body) = try #require(try splitter.next())
        return try Message.decode(type: type, body: body)
    }

    @Test("a deflated chunk is smaller and decodes to the same chunk")
    func roundTrip() throws {
        let (count, delta) = try Self.chunkDelta(records: 2_000)
        let message = Message.chunk(index: 3, count: 9, records: UInt64(count), delta: delta)
        let plain = message.encodedFrame()
        let deflated = message.encodedFrame(deflatingChunk: true)
        #expect(deflated.count * 2 < plain.count, "\(deflated.count) deflated against \(plain.count)")
        #expect(try Self.decodeFrame(deflated) == message)
        #expect(try Self.decodeFrame(plain) == message)
        // Field 5 is what marks it; without the flag the frame is the plain one.
        #expect(message.encodedFrame(deflatingChunk: false) == plain)
    }

    @Test("short and incompressible deltas go as they are")
    func notWorthIt() throws {
        let (count, small) = try Self.chunkDelta(records: 3)
        #expect(small.count < ChunkDeflate.minimumBytes)
        let short = Message.chunk(index: 0, count: 1, records: UInt64(count), delta: small)
        #expect(short.encodedFrame(deflatingChunk: true) == short.encodedFrame())
        var rng = SeededGenerator(seed: baseSeed)
        let noise = (0..<4_096).map { _ in UInt8.random(in: 0...255, using: &rng) }
        #expect(ChunkDeflate.deflate(noise) == nil)
        let random = Message.chunk(index: 0, count: 1, records: 1, delta: noise)
        #expect(random.encodedFrame(deflatingChunk: true) == random.encodedFrame())
    }

    @Test("a deflated delta that is not what it declares is malformed, and nothing larger than the bound is inflated")
    func refused() throws {
        let (_, delta) = try Self.chunkDelta(records: 200)
        let packed = try #require(ChunkDeflate.deflate(delta))
        let n = UInt64(delta.count)
        func reason(_ frame: (type: UInt8, body: [UInt8])) -> String {
            do {
                _ = try Message.decode(type: frame.type, body: frame.body)
                return "accepted"
            } catch {
                return "\(error)"
            }
        }
        #expect(reason(Self.chunkFrame(delta: packed, inflatedLength: n)) == "accepted")
        #expect(reason(Self.chunkFrame(delta: packed, inflatedLength: n - 1)).contains("inflates to more than its declared"))
        #expect(reason(Self.chunkFrame(delta: packed, inflatedLength: n + 1)).contains("inflates to fewer than its declared"))
        #expect(reason(Self.chunkFrame(delta: packed + [0], inflatedLength: n)).contains("bytes after the end"))
        #expect(reason(Self.chunkFrame(delta: Array(packed.dropLast(8)), inflatedLength: n)).contains("not a valid raw DEFLATE stream"))
        #expect(reason(Self.chunkFrame(delta: [0xff, 0xff, 0xff, 0xff], inflatedLength: n)).contains("not a valid raw DEFLATE stream"))
        #expect(reason(Self.chunkFrame(delta: packed, inflatedLength: 0)).contains("outside 1…"))
        // A bomb: 64 MiB of zeros deflates to under 300 KB at level 1; declared as it is, it is refused
        // before anything is inflated; declared within the bound, inflating stops at the bound.
        let zeros = [UInt8](repeating: 0, count: 64 << 20)
        let bomb = try #require(ChunkDeflate.deflateRaw(zeros, capacity: 1 << 20))
        #expect(bomb.count < 400_000)
        #expect(reason(Self.chunkFrame(delta: bomb, inflatedLength: UInt64(zeros.count))).contains("outside 1…"))
        #expect(reason(Self.chunkFrame(delta: bomb, inflatedLength: UInt64(ChunkDeflate.maxInflatedBytes)))
            .contains("inflates to more than its declared"))
        // A record count above the inflated delta's length is malformed as for a plain chunk.
        #expect(reason(Self.chunkFrame(delta: packed, inflatedLength: n, records: n + 1)).contains("records in a delta of"))
    }
}
