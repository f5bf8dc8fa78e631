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
