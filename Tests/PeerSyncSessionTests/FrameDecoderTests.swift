import NIOCore
import NIOEmbedded
import NIOTestUtils
@testable import PeerSyncReplication
@testable import PeerSyncNetwork
@_spi(Engine) import PeerSyncCRDT
import PeerSyncWire
import Testing

/// The production frame decoder, through a channel: swift-nio's verifier feeds the bytes whole,
/// byte by byte and in random splits, and checks that no frame is lost, duplicated or left over.
@Suite("Frame decoder")
struct FrameDecoderTests {
    @Test("frames come out whole however the bytes are split")
    func verifier() throws {
        let frames: [(UInt8, [UInt8])] = [(6, [8, 1]), (3, Array(repeating: 0xAB, count: 300)), (1, []), (9, Array(0...255))]
        let bytes = frames.flatMap { Frame.encode(type: $0.0, body: $0.1) }
        try ByteToMessageDecoderVerifier.verifyDecoder(
            inputOutputPairs: [(ByteBuffer(bytes: bytes), frames.map { InboundFrame(type: $0.0, body: $0.1) })]
        ) { FrameDecoder(maxFrameBytes: 4 << 20) }
    }

    @Test("a length over the limit fails the channel before the body arrives")
    func overLimit() throws {
        let channel = EmbeddedChannel(handler: ByteToMessageHandler(FrameDecoder(maxFrameBytes: 65_536)))
        var header = ByteBuffer()
        var length: [UInt8] = []
        Varint.append(70_000, to: &length)
        header.writeBytes(length)
        #expect(throws: WireError.frameTooLarge(length: 70_000, limit: 65_536)) { try channel.writeInbound(header) }
        _ = try? channel.finish()
    }

    @Test("the frames of one read go on as one batch; a frame error passes on the frames before it first")
    func batchesPerRead() throws {
        let channel = EmbeddedChannel()
        try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(FrameDecoder(maxFrameBytes: 65_536)))
        try channel.pipeline.syncOperations.addHandler(FrameBatcher())
        let frames: [(UInt8, [UInt8])] = [(3, [1, 2]), (3, [3]), (6, [8, 1])]
        // One read (writeInbound ends with the read's completion): three frames and half of a fourth.
        let fourth = Frame.encode(type: 7, body: [9, 9])
        try channel.writeInbound(ByteBuffer(bytes: frames.flatMap { Frame.encode(type: $0.0, body: $0.1) } + fourth.prefix(2)))
        #expect(try channel.readInbound(as: [InboundFrame].self) == frames.map { InboundFrame(type: $0.0, body: $0.1) })
        #expect(try channel.readInbound(as: [InboundFrame].self) == nil)
        // The next read completes the fourth: a batch of one.
        try channel.writeInbound(ByteBuffer(bytes: Array(fourth.dropFirst(2))))
        #expect(try channel.readInbound(as: [InboundFrame].self) == [InboundFrame(type: 7, body: [9, 9])])
        // A good frame, then a length over the limit in the same read: the good one goes on first.
        var length: [UInt8] = []
        Varint.append(70_000, to: &length)
        #expect(throws: WireError.frameTooLarge(length: 70_000, limit: 65_536)) {
            try channel.writeInbound(ByteBuffer(bytes: Frame.encode(type: 3, body: [5]) + length))
        }
        #expect(try channel.readInbound(as: [InboundFrame].self) == [InboundFrame(type: 3, body: [5])])
        _ = try? channel.finish()
    }
}
