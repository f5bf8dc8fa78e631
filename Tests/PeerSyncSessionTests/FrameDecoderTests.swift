import NIOCore
import NIOEmbedded
import NIOTestUtils
@testable import PeerSyncSession
import PeerSyncCRDT
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
}
