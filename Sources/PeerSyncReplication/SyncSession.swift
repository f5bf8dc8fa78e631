@_spi(Engine) import PeerSyncCRDT
import PeerSyncWire
import Synchronization

/// A sync session over a transport the app brings — MultipeerConnectivity, Bluetooth, a
/// WebSocket, a pipe — with the same catch-up, deltas, checks and forwarding as the TCP path:
/// bytes in, bytes out.
///
/// ```swift
/// let session = try await replica.openSession(address: "multipeer:Anna's iPad", initiator: true)
/// Task { while let message = await session.nextMessage() { try transport.send(message) } }
/// for await data in transport.received { await session.receive(data) }
/// await session.transportClosed()
/// ```
///
/// Each message from ``nextMessage()`` is one or more whole frames (docs/PROTOCOL.md §2); give
/// them to the other side's ``receive(_:)`` in order. A stream transport may also cut or join
/// them arbitrarily: ``receive(_:)`` reassembles frames. The transport must deliver bytes in
/// order and should be encrypted by the app (this layer authenticates devices, adds no TLS).
///
/// A session can end while the transport stays up: a goodbye, a handshake or dead-peer
/// timeout, a refusal that says "try again". ``nextMessage()`` then returns nil. As the TCP
/// transport redials, reconnect: a new connection, with a backoff, and a new session on it —
/// never a second session on the same byte stream (docs/APPLE.md, "When a session ends").
public final class SyncSession: Sendable {
    package let id: SessionID
    package let origin: SessionOrigin
    let replicator: Replicator
    private let signal: OutputSignal
    private let splitter: Mutex<FrameSplitter>
    private let ended = Atomic<Bool>(false)

    init(id: SessionID, origin: SessionOrigin, replicator: Replicator, signal: OutputSignal, maxFrameBytes: Int) {
        self.id = id
        self.origin = origin
        self.replicator = replicator
        self.signal = signal
        splitter = Mutex(FrameSplitter(maxFrameBytes: maxFrameBytes))
    }

    /// Opens a session on `replicator` for a transport the app runs. `initiator`: whether this
    /// side started the connection (of two sessions between one pair, the one started by the
    /// lower replica ID is kept).
    package static func open(on replicator: Replicator, address: String, initiator: Bool) async -> SyncSession {
        let origin = SessionOrigin(address: address, initiator: initiator)
        // Holder lets the close callback reach the session created after it.
        let holder = Mutex<SyncSession?>(nil)
        let (id, signal) = await replicator.openSession(origin, close: {
            if let session = holder.withLock({ $0 }) { session.markEnded() }
        })
        let session = SyncSession(id: id, origin: origin, replicator: replicator, signal: signal,
                                  maxFrameBytes: replicator.configuration.limits.maxFrameBytes)
        holder.withLock { $0 = session }
        return session
    }

    /// Bytes received from the peer, in order (any split). A framing error ends the session with
    /// an error frame to the peer.
    public func receive(_ bytes: some Collection<UInt8>) async {
        guard !ended.load(ordering: .acquiring) else { return }
        let chunk = Array(bytes)
        var frames: [(UInt8, [UInt8])] = []
        let failure: WireError? = splitter.withLock { splitter -> WireError? in
            splitter.append(chunk)
            do throws(WireError) {
                while let frame = try splitter.next() { frames.append((frame.type, frame.body)) }
                return nil
            } catch {
                return error
            }
        }
        await replicator.receive(id, frames: frames.map { (type: $0.0, body: $0.1) })
        if let failure { await replicator.frameError(id, failure) }
    }

    /// The next message to send to the peer; waits until there is one. nil when the session
    /// has ended (after its last frame — a goodbye or an error — was returned).
    public func nextMessage() async -> [UInt8]? {
        while !ended.load(ordering: .acquiring) {
            if let batch = await replicator.nextBatch(id) {
                if batch.closeAfter { finish(reason: .localShutdown) }
                return batch.bytes
            }
            guard await signal.wait() else { break }
        }
        return nil
    }

    /// The peer, once its hello has arrived.
    public func peer() async -> ReplicaID? { await replicator.peerReplica(of: id) }

    /// Ends the session from this side: a goodbye follows what is queued (keep calling
    /// ``nextMessage()`` to send it).
    public func close() async {
        await replicator.closeSession(id)
    }

    /// The app's transport is gone (disconnected, failed).
    public func transportClosed() async {
        finish(reason: .connectionLost(detail: "the app's transport closed"))
    }

    private func markEnded() {
        finish(reason: .connectionLost(detail: ""))
    }

    private func finish(reason: SessionEndReason) {
        guard !ended.exchange(true, ordering: .acquiringAndReleasing) else { return }
        let replicator = self.replicator
        let id = self.id
        Task { await replicator.transportEnded(id, reason: reason) }
    }
}
