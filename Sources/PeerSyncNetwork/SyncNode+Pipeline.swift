import PeerSyncReplication
import NIOCore
import NIOSSL
import PeerSyncWire

extension SyncNode {
    /// What the limits refused so far, and the dialing now.
    public func limitStatus() async -> LimitStatus {
        let counts = inbound.counts
        let dials = await dialer.status()
        return LimitStatus(refusedOverTotal: counts.overTotal, refusedOverAddress: counts.overAddress, inboundOpen: counts.open,
                           dialTargets: dials.targets, dialing: dials.dialing, dialingPeak: dials.peak,
                           rejectedTargets: dials.rejected, dialAttempts: dials.attempts)
    }

    /// A connection's pipeline: byte counter, TLS (with the peer's device ID once authenticated),
    /// frame decoder, frames of one read passed on together.
    static func configurePipeline(_ channel: any Channel, tls: DeviceTLS?, dialed: Bool, maxFrame: Int, legacy: Bool = false) throws
        -> (NIOAsyncChannel<[InboundFrame], ByteBuffer>, TLSPeer?)
    {
        try channel.pipeline.syncOperations.addHandler(ByteCounter(), name: "bytes")
        let peer = legacy ? try tls?.configureLegacyClient(channel) : try tls?.configure(channel, dialed: dialed)
        try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(FrameDecoder(maxFrameBytes: maxFrame)))
        try channel.pipeline.syncOperations.addHandler(FrameBatcher())
        return (try NIOAsyncChannel(wrappingChannelSynchronously: channel), peer)
    }

    /// Pulls what the replicator decides to send and writes it, until the session ends or a
    /// final frame (goodbye, error) has been written.
    static func pump(
        _ id: SessionID, signal: OutputSignal, replicator: Replicator, write: (OutboundBatch) async throws -> Void
    ) async {
        do {
            while true {
                while let batch = await replicator.nextBatch(id) {
                    try await write(batch)
                    if batch.closeAfter { return }
                }
                guard await signal.wait() else { return }
            }
        } catch {
            // The connection is closing; the reader reports why.
        }
    }

    static func classify(_ error: any Error) -> SessionEndReason {
        if error is NIOSSLError || error is BoringSSLError { return .handshakeFailed(detail: "\(error)") }
        if let error = error as? ByteToMessageDecoderError { return .refused(.malformed, detail: "bad frame: \(error)") }
        return .connectionLost(detail: "\(error)")
    }
}
