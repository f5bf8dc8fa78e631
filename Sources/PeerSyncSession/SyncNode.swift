import Logging
import NIOCore
import NIOPosix
import NIOSSL
import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncWire

/// The TCP (+TLS) transport of a node: listens, dials peers and redials them with backoff, and
/// moves bytes between each connection and the node's ``Replicator``, which makes every
/// decision. One shell among others: an app's own transport uses ``SyncSession`` instead.
public actor SyncNode {
    public nonisolated let replicator: Replicator
    public nonisolated var configuration: SyncConfiguration { replicator.configuration }
    nonisolated let logger: Logger
    private nonisolated let tls: DeviceTLS?
    private var server: NIOAsyncChannel<(NIOAsyncChannel<InboundFrame, ByteBuffer>, TLSPeer?), Never>?
    private var tasks: [Task<Void, Never>] = []
    private var connections: [ObjectIdentifier: any Channel] = [:]
    /// Dialed address → replica it turned out to be (to avoid dialing a peer connected the other way).
    private var addressReplica: [String: ReplicaID] = [:]
    private var stopped = false

    /// A node for `replicator`. Nothing happens until ``start()``.
    ///
    /// - Throws: if the TLS contexts cannot be built from the configuration's security.
    public init(replicator: Replicator, logger: Logger) throws {
        self.replicator = replicator
        var logger = logger
        logger[metadataKey: "replica"] = "\(replicator.replicaID.shortDescription)"
        if replicator.configuration.security.isInsecure { logger[metadataKey: "security"] = "INSECURE" }
        self.logger = logger
        // TLS admits every device: the session layer authenticates it again and asks the roster,
        // so a refused device gets a reason it can act on instead of a failed handshake.
        tls = replicator.configuration.security == .tls
            ? try DeviceTLS(key: replicator.deviceKey, legacySecret: replicator.legacySecret) { _ in true } : nil
    }

    /// A node with its own replicator over `storage`.
    public init(storage: any SyncStorage, replicaID: ReplicaID, name: String, identity: LocalIdentity,
                configuration: SyncConfiguration, logger: Logger) throws {
        try self.init(replicator: Replicator(storage: storage, replicaID: replicaID, name: name, identity: identity,
                                             configuration: configuration, logger: logger), logger: logger)
    }

    /// What the node does (connections, catch-up progress, convergence, remote changes).
    public nonisolated func events() -> AsyncStream<NodeEvent> { replicator.events() }

    /// Ships a committed local delta to every connected peer.
    public func broadcast(_ delta: RecordMap) async { await replicator.broadcast(delta) }

    /// The peers with an established session.
    public func peers() async -> [PeerStatus] { await replicator.peers() }

    /// Bytes and frames of every session so far, TLS records included.
    public func traffic() async -> TrafficCounters { await replicator.traffic() }

    // MARK: - Lifecycle

    /// Starts listening (if the configuration says where) and dialing the configured peers.
    /// Returns the bound port (0 without a listener).
    @discardableResult
    public func start() async throws -> UInt16 {
        if configuration.security.isInsecure {
            logger.warning("INSECURE mode: sessions are plain TCP, anyone on the network can read and change the data")
        }
        var port: UInt16 = 0
        if let listen = configuration.listen {
            let tls = self.tls
            let maxFrame = configuration.limits.maxFrameBytes
            let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
                .bind(host: listen.host, port: Int(listen.port)) { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try Self.configurePipeline(channel, tls: tls, dialed: false, maxFrame: maxFrame)
                    }
                }
            self.server = server
            port = UInt16(server.channel.localAddress?.port ?? Int(listen.port))
            logger.info("listening", metadata: ["listen.port": "\(port)", "listen.host": "\(listen.host)"])
            replicator.emit(.listening(port: port))
            tasks.append(Task { await self.acceptLoop(server) })
        }
        for peer in configuration.peers { addPeer(peer) }
        return port
    }

    /// Dials `address` now and again whenever the session ends, with backoff and jitter, until
    /// the node stops.
    public func addPeer(_ address: PeerAddress) {
        guard !stopped else { return }
        tasks.append(Task { await self.dialLoop(address) })
    }

    /// Says goodbye to every peer (each goodbye is flushed before its connection closes, within
    /// the drain timeout), then closes the listener and every connection.
    public func stop() async {
        guard !stopped else { return }
        stopped = true
        // Goodbyes first (connection tasks must still be running to write them), then the rest.
        await replicator.shutdown()
        for task in tasks { task.cancel() }
        try? await server?.channel.close()
        for channel in connections.values { try? await channel.close() }
        for task in tasks { await task.value }
        tasks = []
        logger.info("stopped")
    }

    // MARK: - Connections

    /// A connection's pipeline: byte counter, TLS (with the peer's device ID once authenticated),
    /// frame decoder.
    static func configurePipeline(_ channel: any Channel, tls: DeviceTLS?, dialed: Bool, maxFrame: Int, legacy: Bool = false) throws
        -> (NIOAsyncChannel<InboundFrame, ByteBuffer>, TLSPeer?)
    {
        try channel.pipeline.syncOperations.addHandler(ByteCounter(), name: "bytes")
        let peer = legacy ? try tls?.configureLegacyClient(channel) : try tls?.configure(channel, dialed: dialed)
        try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(FrameDecoder(maxFrameBytes: maxFrame)))
        return (try NIOAsyncChannel(wrappingChannelSynchronously: channel), peer)
    }

    private func acceptLoop(_ server: NIOAsyncChannel<(NIOAsyncChannel<InboundFrame, ByteBuffer>, TLSPeer?), Never>) async {
        do {
            try await withThrowingDiscardingTaskGroup { group in
                try await server.executeThenClose { inbound in
                    for try await (child, peer) in inbound {
                        let address = child.channel.remoteAddress.map { "\($0.ipAddress ?? "?"):\($0.port ?? 0)" } ?? "?"
                        group.addTask { await self.run(child, tls: peer, address: address, initiator: false) }
                    }
                }
            }
        } catch {
            if !stopped { logger.error("listener failed", metadata: ["error": "\(error)"]) }
        }
    }

    private func dialLoop(_ address: PeerAddress) async {
        var failures = 0
        let backoff = configuration.timing.reconnectBackoff
        while !stopped && !Task.isCancelled {
            if let replica = addressReplica[address.description],
               await replicator.peers().contains(where: { $0.info.replicaID == replica }) {
                // Connected the other way round; look again later.
                try? await Task.sleep(for: backoff.max)
                continue
            }
            let started = ContinuousClock.now
            await dial(address)
            if stopped || Task.isCancelled { break }
            // A session that lasted a while resets the backoff.
            failures = ContinuousClock.now - started > .seconds(10) ? 0 : failures + 1
            try? await Task.sleep(for: backoff.delay(afterFailures: failures - 1, unit: .random(in: -1...1)))
        }
    }

    private func dial(_ address: PeerAddress, legacy: Bool = false) async {
        let tls = self.tls
        let maxFrame = configuration.limits.maxFrameBytes
        do {
            let (channel, peer) = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .connectTimeout(.seconds(3))
                .channelOption(.socketOption(.tcp_nodelay), value: 1)
                .connect(host: address.host, port: Int(address.port)) { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try Self.configurePipeline(channel, tls: tls, dialed: true, maxFrame: maxFrame, legacy: legacy)
                    }
                }
            let handshook = await run(channel, tls: peer, address: address.description, initiator: true)
            // A node of the previous version only speaks TLS 1.2 with the old group secret: try
            // that once, so it hears "upgrade" instead of a failed handshake.
            if !handshook, !legacy, tls?.legacyClientContext != nil, !stopped { await dial(address, legacy: true) }
        } catch {
            logger.debug("dial failed", metadata: ["peer.address": "\(address)", "error": "\(error)"])
            replicator.emit(.sessionRefused(address: address.description, reason: .unreachable(detail: "\(error)")))
        }
    }

    /// One connection's life: a reader feeding frames to the replicator and a writer pulling
    /// what it decides to send.
    /// Returns false if the TLS handshake failed (nothing else happened).
    @discardableResult
    private func run(_ channel: NIOAsyncChannel<InboundFrame, ByteBuffer>, tls: TLSPeer?, address: String, initiator: Bool) async -> Bool {
        let raw = channel.channel
        guard !stopped else {
            try? await raw.close()
            return true
        }
        var device: DeviceID?
        if let tls {
            // The session starts once TLS knows the peer's device (bounded by the handshake timeout).
            let timeout = raw.eventLoop.scheduleTask(in: .milliseconds(configuration.timing.handshakeTimeout.wholeMilliseconds)) {
                raw.close(promise: nil)
            }
            defer { timeout.cancel() }
            do {
                device = try await tls.authenticated.get()
            } catch DeviceTLSError.legacyPeer {
                device = nil  // a node of the previous version: the session tells it to upgrade
            } catch {
                try? await raw.close()
                logger.warning("session refused", metadata: ["peer.address": "\(address)", "reason": "\(SessionEndReason.handshakeFailed(detail: "\(error)"))"])
                replicator.emit(.sessionRefused(address: address, reason: .handshakeFailed(detail: "\(error)")))
                return false
            }
        }
        let origin = SessionOrigin(address: address, initiator: initiator, transportDevice: device)
        connections[ObjectIdentifier(raw)] = raw
        defer { connections[ObjectIdentifier(raw)] = nil }
        let counter = try? await raw.pipeline.handler(type: ByteCounter.self).get()
        var counters: (@Sendable () -> (read: Int, written: Int))?
        if let counter { counters = { (read: counter.read, written: counter.written) } }
        let (id, signal) = await replicator.openSession(origin, close: { raw.close(promise: nil) }, counters: counters)
        let replicator = self.replicator
        let secure = false  // TLS failures were reported before the session opened
        var reason = SessionEndReason.connectionLost(detail: "")
        do {
            try await channel.executeThenClose { inbound, outbound in
                let writer = Task {
                    await Self.pump(id, signal: signal, replicator: replicator) { batch in
                        try await outbound.write(raw.allocator.buffer(bytes: batch.bytes))
                    }
                    raw.close(promise: nil)
                }
                var frameError = false
                do {
                    var sawFrame = false
                    for try await frame in inbound {
                        sawFrame = true
                        await replicator.receive(id, type: frame.type, body: frame.body)
                    }
                    reason = !sawFrame && secure
                        ? .handshakeFailed(detail: "the connection closed before the peer's hello") : .connectionLost(detail: "")
                } catch let error as WireError {
                    await replicator.frameError(id, error)
                    frameError = true
                } catch {
                    reason = Self.classify(error)
                }
                if let peer = await replicator.peerReplica(of: id), origin.initiator {
                    self.remember(peer, at: origin.address)
                }
                if frameError {
                    await writer.value  // the error frame goes out first (bounded by the drain timeout)
                } else {
                    await replicator.transportEnded(id, reason: reason)
                    await writer.value
                }
            }
        } catch {
            reason = Self.classify(error)
        }
        await replicator.transportEnded(id, reason: reason)
        return true
    }

    private func remember(_ replica: ReplicaID, at address: String) { addressReplica[address] = replica }

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
