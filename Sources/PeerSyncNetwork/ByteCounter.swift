import PeerSyncReplication
import NIOCore
import Synchronization

/// Counts the raw bytes a channel reads and writes (at the socket end of the pipeline, so TLS
/// overhead is included).
final class ByteCounter: ChannelDuplexHandler, Sendable {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let counts = Mutex((read: 0, written: 0))

    var read: Int { counts.withLock { $0.read } }
    var written: Int { counts.withLock { $0.written } }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let n = unwrapInboundIn(data).readableBytes
        counts.withLock { $0.read += n }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let n = unwrapOutboundIn(data).readableBytes
        counts.withLock { $0.written += n }
        context.write(data, promise: promise)
    }
}
