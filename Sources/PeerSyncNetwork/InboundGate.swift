import PeerSyncReplication
import NIOCore
import Synchronization

/// The node's ``InboundAdmission``, shared by the listener's event loop (which asks) and the
/// connections' event loops (which report closes).
final class InboundLimiter: Sendable {
    private let admission: Mutex<InboundAdmission>
    /// Called with a report to log (at most once per ``InboundAdmission/reportInterval``).
    private let report: @Sendable (InboundAdmission.Report) -> Void

    init(limits: SyncLimits, report: @escaping @Sendable (InboundAdmission.Report) -> Void) {
        admission = Mutex(InboundAdmission(limits: limits))
        self.report = report
    }

    /// Admits or refuses a connection just accepted; an admitted one is counted until it closes.
    func admit(_ channel: any Channel) -> Bool {
        let address = channel.remoteAddress?.ipAddress ?? "unknown"
        let (refusal, due) = admission.withLock { $0.arrived(from: address, now: .now) }
        if let due { report(due) }
        guard refusal == nil else { return false }
        channel.closeFuture.whenComplete { _ in self.admission.withLock { $0.closed(from: address) } }
        return true
    }

    /// Refusals so far, and the connections open now.
    var counts: (overTotal: Int, overAddress: Int, open: Int) {
        admission.withLock { ($0.refusedOverTotal, $0.refusedOverAddress, $0.openCount) }
    }
}

/// The first handler of the listening channel: every accepted connection passes through it
/// before its own pipeline (TLS) is set up. One over a limit is closed here, at once: no TLS
/// handshake, no session, no buffer.
final class InboundGate: ChannelInboundHandler {
    typealias InboundIn = any Channel
    typealias InboundOut = any Channel

    private let limiter: InboundLimiter

    init(_ limiter: InboundLimiter) {
        self.limiter = limiter
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let child = Self.unwrapInboundIn(data)
        guard limiter.admit(child) else {
            child.close(promise: nil)
            return
        }
        context.fireChannelRead(data)
    }
}
