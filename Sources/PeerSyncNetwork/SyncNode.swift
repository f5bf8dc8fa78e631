import PeerSyncReplication
import Logging
import NIOCore
import NIOPosix
import NIOSSL
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncWire

/// The TCP (+TLS) transport of a node: listens, dials peers and redials them with backoff, and
/// moves bytes between each connection and the node's ``Replicator``, which makes every
/// decision. One shell among others: an app's own transport uses ``SyncSession`` instead.
///
/// Its own decisions are made by pure types too: which inbound connections to take
/// (``InboundAdmission``, before any TLS work) and which addresses to dial when
/// (``DialScheduler``), within ``SyncLimits``.
package actor SyncNode {
    public nonisolated let replicator: Replicator
    public nonisolated var configuration: SyncConfiguration { replicator.configuration }
    nonisolated let logger: Logger
    private nonisolated let tls: DeviceTLS?
    private var server: NIOAsyncChannel<(NIOAsyncChannel<[InboundFrame], ByteBuffer>, TLSPeer?), Never>?
    private var tasks: [Task<Void, Never>] = []
    /// The accept loop: never cancelled, it ends when the listener closes, after it has consumed
    /// every connection already accepted (NIO traps on an accepted channel left unconsumed).
    private var acceptTask: Task<Void, Never>?
    private var connections: [ObjectIdentifier: any Channel] = [:]
    nonisolated let inbound: InboundLimiter
    /// Accepted connections until the accept loop takes them (NIO traps on one dropped).
    nonisolated let accepted = AcceptedChannels()
    let dialer: Dialer
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
        inbound = InboundLimiter(limits: replicator.configuration.limits) { [logger, replicator] report in
            logger.warning("inbound connections refused: limit reached", metadata: [
                "refused.overTotal": "\(report.overTotal)", "refused.overAddress": "\(report.overAddress)",
                "peer.address": "\(report.lastAddress)",
            ])
            replicator.emit(.connectionsRefused(overTotal: report.overTotal, overAddress: report.overAddress,
                                                lastAddress: report.lastAddress))
        }
        dialer = Dialer(settings: DialScheduler.Settings(limits: replicator.configuration.limits, timing: replicator.configuration.timing),
                        logger: logger)
    }

    /// A node with its own replicator over `storage`.
    package init(storage: any SyncStorage, replicaID: ReplicaID, name: String, identity: LocalIdentity,
                configuration: SyncConfiguration, logger: Logger) throws {
        try self.init(replicator: Replicator(storage: storage, replicaID: replicaID, name: name, identity: identity,
                                             configuration: configuration, logger: logger), logger: logger)
    }

    /// What the node does (connections, catch-up progress, convergence, remote changes).
    public nonisolated func events() -> AsyncStream<NodeEvent> { replicator.events() }

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
            let inbound = self.inbound
            let accepted = self.accepted
            let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .serverChannelInitializer { channel in
                    // Before the accept handler: a connection over a limit never gets a pipeline.
                    channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(InboundGate(inbound)) }
                }
                .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
                .bind(host: listen.host, port: Int(listen.port)) { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try accepted.register { try Self.configurePipeline(channel, tls: tls, dialed: false, maxFrame: maxFrame) }
                    }
                }
            self.server = server
            port = UInt16(server.channel.localAddress?.port ?? Int(listen.port))
            logger.info("listening", metadata: ["listen.port": "\(port)", "listen.host": "\(listen.host)"])
            replicator.emit(.listening(port: port))
            acceptTask = Task { await self.acceptLoop(server) }
        }
        await followRoster()
        for peer in configuration.peers { await addPeer(peer) }
        return port
    }

    /// Keeps the dialer told which replica IDs belong to removed devices (never dialed).
    private func followRoster() async {
        let (replicator, dialer) = (self.replicator, self.dialer)
        let events = replicator.events()
        let roster = await replicator.roster
        await dialer.setRemoved(replicas: roster.replicasOfRemovedDevices, devices: roster.removedDevices)
        tasks.append(Task {
            for await event in events {
                if case .rosterChanged(let roster, _) = event {
                    await dialer.setRemoved(replicas: roster.replicasOfRemovedDevices, devices: roster.removedDevices)
                }
            }
        })
    }

    /// Dials `address` now and again whenever the session ends, with backoff and jitter, until
    /// the node stops (``SyncLimits`` bounds the attempts running at once).
    public func addPeer(_ address: PeerAddress) async {
        await dial(address, for: .configured)
    }

    /// Dials `address`, advertised on the LAN as `serviceName` (for `replicaID`, if the advert
    /// names one), until ``lost(serviceName:)``. Discovered addresses take their turn after static
    /// peers; one whose sessions fail to authenticate or are refused is redialed with
    /// ``SyncLimits/rejectedDialBackoff``; an advert naming a replica ID that a removed device
    /// claimed is not dialed.
    public func discovered(_ address: PeerAddress, serviceName: String, replicaID: ReplicaID? = nil) async {
        await dial(address, for: .discovered(serviceName: serviceName), replica: replicaID)
    }

    /// The advertisement `serviceName` was withdrawn: its address is no longer dialed once its
    /// current attempt or session ends (the session itself is not cut).
    public func lost(serviceName: String) async {
        await dialer.remove(.discovered(serviceName: serviceName))
    }

    private func dial(_ address: PeerAddress, for source: DialScheduler.Source, replica: ReplicaID? = nil) async {
        guard !stopped else { return }
        await dialer.start { [weak self] address, established in
            guard let self else { return Dialer.Result(reason: .localShutdown, established: false, lasted: .zero) }
            return await self.attempt(address, established: established)
        }
        await dialer.add(address, source: source, replica: replica)
    }

    /// Says goodbye to every peer (each goodbye is flushed before its connection closes, within
    /// the drain timeout), then closes the listener and every connection.
    public func stop() async {
        guard !stopped else { return }
        stopped = true
        await dialer.stop()
        // Goodbyes first (connection tasks must still be running to write them), then the rest.
        await replicator.shutdown()
        for task in tasks { task.cancel() }
        try? await server?.channel.close()
        for channel in connections.values { try? await channel.close() }
        for task in tasks { await task.value }
        await acceptTask?.value
        // Connections accepted as the listener closed, which its stream never delivered.
        for leftover in accepted.close() { try? await leftover.executeThenClose { _, _ in } }
        await dialer.finish()
        tasks = []
        acceptTask = nil
        logger.info("stopped")
    }

    // MARK: - Connections

    private func acceptLoop(_ server: NIOAsyncChannel<(NIOAsyncChannel<[InboundFrame], ByteBuffer>, TLSPeer?), Never>) async {
        do {
            try await withThrowingDiscardingTaskGroup { group in
                try await server.executeThenClose { inbound in
                    for try await (child, peer) in inbound {
                        accepted.take(child)
                        let address = child.channel.remoteAddress.map { "\($0.ipAddress ?? "?"):\($0.port ?? 0)" } ?? "?"
                        group.addTask { _ = await self.run(child, tls: peer, address: address, initiator: false) }
                    }
                }
            }
        } catch {
            if !stopped { logger.error("listener failed", metadata: ["error": "\(error)"]) }
        }
    }

    /// One attempt for the dialer: nothing if a session with the peer at `address` runs the
    /// other way round; else connect and run the session until it ends.
    private func attempt(_ address: PeerAddress, established: @escaping @Sendable () -> Void) async -> Dialer.Result? {
        guard !stopped else { return Dialer.Result(reason: .localShutdown, established: false, lasted: .zero) }
        if let replica = addressReplica[address.description],
           await replicator.peers().contains(where: { $0.info.replicaID == replica }) {
            return nil
        }
        let result = await connect(address, legacy: false, established: established)
        // A node of the previous version only speaks TLS 1.2 with the old group secret: try
        // that once, so it hears "upgrade" instead of a failed handshake.
        guard case .handshakeFailed = result.reason, !result.established, tls?.legacyClientContext != nil, !stopped else {
            return result
        }
        return await connect(address, legacy: true, established: established)
    }

    /// Connects to `address` (over the old TLS 1.2 PSK if `legacy`) and runs the session.
    private func connect(_ address: PeerAddress, legacy: Bool, established: @escaping @Sendable () -> Void) async -> Dialer.Result {
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
            return await run(channel, tls: peer, address: address.description, initiator: true, established: established)
        } catch {
            logger.debug("dial failed", metadata: ["peer.address": "\(address)", "error": "\(error)"])
            replicator.emit(.sessionRefused(address: address.description, reason: .unreachable(detail: "\(error)")))
            return Dialer.Result(reason: .unreachable(detail: "\(error)"), established: false, lasted: .zero)
        }
    }

    /// One connection's life: a reader feeding frames to the replicator and a writer pulling
    /// what it decides to send. Returns why it ended; `established` is called when its session is.
    private func run(_ channel: NIOAsyncChannel<[InboundFrame], ByteBuffer>, tls: TLSPeer?, address: String, initiator: Bool,
                     established: (@Sendable () -> Void)? = nil) async -> Dialer.Result {
        let raw = channel.channel
        guard !stopped else {
            try? await channel.executeThenClose { _, _ in }
            return Dialer.Result(reason: .localShutdown, established: false, lasted: .zero)
        }
        // Known from the start, so that `stop()` closes it even mid-handshake.
        connections[ObjectIdentifier(raw)] = raw
        defer { connections[ObjectIdentifier(raw)] = nil }
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
                try? await channel.executeThenClose { _, _ in }
                logger.debug("session refused", metadata: ["peer.address": "\(address)", "reason": "\(SessionEndReason.handshakeFailed(detail: "\(error)"))"])
                replicator.emit(.sessionRefused(address: address, reason: .handshakeFailed(detail: "\(error)")))
                return Dialer.Result(reason: stopped ? .localShutdown : .handshakeFailed(detail: "\(error)"), established: false, lasted: .zero)
            }
        }
        guard !stopped else {
            try? await channel.executeThenClose { _, _ in }
            return Dialer.Result(reason: .localShutdown, established: false, lasted: .zero)
        }
        let origin = SessionOrigin(address: address, initiator: initiator, transportDevice: device)
        let counter = try? await raw.pipeline.handler(type: ByteCounter.self).get()
        var counters: (@Sendable () -> (read: Int, written: Int))?
        if let counter { counters = { (read: counter.read, written: counter.written) } }
        let (id, signal) = await replicator.openSession(origin, close: { raw.close(promise: nil) }, counters: counters,
                                                        established: established)
        let replicator = self.replicator
        let opened = ContinuousClock.now
        var reason = SessionEndReason.connectionLost(detail: "")
        var ended: (reason: SessionEndReason, established: Bool)?
        var peerReplica: ReplicaID?
        var peerDevice: DeviceID?
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
                    for try await frames in inbound {
                        await replicator.receive(id, frames: frames.map { (type: $0.type, body: $0.body) })
                    }
                } catch let error as WireError {
                    await replicator.frameError(id, error)
                    frameError = true
                } catch {
                    reason = Self.classify(error)
                }
                if let peer = await replicator.peerReplica(of: id), origin.initiator {
                    self.remember(peer, at: origin.address)
                    peerReplica = peer
                    peerDevice = await replicator.peerDevice(of: id)
                }
                if frameError {
                    await writer.value  // the error frame goes out first (bounded by the drain timeout)
                } else {
                    ended = await replicator.transportEnded(id, reason: reason)
                    await writer.value
                }
            }
        } catch {
            reason = Self.classify(error)
        }
        ended = await replicator.transportEnded(id, reason: reason) ?? ended
        return Dialer.Result(reason: ended?.reason ?? reason, established: ended?.established ?? false,
                             lasted: ContinuousClock.now - opened, peer: peerReplica, peerDevice: peerDevice)
    }

    private func remember(_ replica: ReplicaID, at address: String) { addressReplica[address] = replica }
}
