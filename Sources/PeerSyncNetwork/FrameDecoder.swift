import PeerSyncReplication
import NIOCore
import PeerSyncWire

/// One frame as read off the connection: its type byte and body, not yet decoded.
struct InboundFrame: Sendable, Equatable {
    let type: UInt8
    let body: [UInt8]
}

/// Splits the inbound byte stream into frames (layout: ``Frame``). A length over the limit
/// fails the channel at once, before the body is buffered.
struct FrameDecoder: ByteToMessageDecoder {
    typealias InboundOut = InboundFrame
    let maxFrameBytes: Int

    mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
        let header = try Frame.header(buffer.readableBytesView, maxFrameBytes: maxFrameBytes)
        guard case .frame(let length, let headerBytes) = header, buffer.readableBytes >= headerBytes + length else {
            return .needMoreData
        }
        buffer.moveReaderIndex(forwardBy: headerBytes)
        let type = buffer.readInteger(as: UInt8.self)!
        let body = buffer.readBytes(length: length - 1)!
        context.fireChannelRead(wrapInboundOut(InboundFrame(type: type, body: body)))
        return .continue
    }

    mutating func decodeLast(context: ChannelHandlerContext, buffer: inout ByteBuffer, seenEOF: Bool) throws -> DecodingState {
        while try decode(context: context, buffer: &buffer) == .continue {}
        return .needMoreData
    }
}

/// Passes on the frames of one read (everything decoded before the read completes) as one
/// array, so the replicator handles them together: live deltas that shared a TLS record then
/// share a commit. It holds only frames already whole, for the length of one read; a frame
/// error or the end of the connection passes on what came before it first.
final class FrameBatcher: ChannelInboundHandler {
    typealias InboundIn = InboundFrame
    typealias InboundOut = [InboundFrame]
    private var pending: [InboundFrame] = []

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        pending.append(unwrapInboundIn(data))
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        flush(context)
        context.fireChannelReadComplete()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        flush(context)
        context.fireErrorCaught(error)
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        flush(context)  // the end of input: frames the decoder found in what was left go first
        context.fireUserInboundEventTriggered(event)
    }

    func channelInactive(context: ChannelHandlerContext) {
        flush(context)
        context.fireChannelInactive()
    }

    private func flush(_ context: ChannelHandlerContext) {
        guard !pending.isEmpty else { return }
        let frames = pending
        pending = []
        context.fireChannelRead(wrapInboundOut(frames))
    }
}

extension NIOAsyncChannelInboundStream where Element == [InboundFrame] {
    /// The frames one at a time, for clients that read a few (the doctor's probe, tests).
    var frames: InboundFrames { InboundFrames(base: self) }
}

/// The frames of an inbound stream of frame batches, one at a time.
struct InboundFrames: AsyncSequence {
    typealias Element = InboundFrame
    let base: NIOAsyncChannelInboundStream<[InboundFrame]>

    struct AsyncIterator: AsyncIteratorProtocol {
        var base: NIOAsyncChannelInboundStream<[InboundFrame]>.AsyncIterator
        var buffered: ArraySlice<InboundFrame> = []

        mutating func next() async throws -> InboundFrame? {
            while buffered.isEmpty {
                guard let batch = try await base.next() else { return nil }
                buffered = batch[...]
            }
            return buffered.popFirst()
        }
    }

    func makeAsyncIterator() -> AsyncIterator { AsyncIterator(base: base.makeAsyncIterator()) }
}
