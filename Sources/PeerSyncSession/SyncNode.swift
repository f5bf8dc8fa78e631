import Logging
import NIOCore
import NIOPosix
import NIOSSL
import PeerSyncCRDT
import PeerSyncModel
import PeerSyncWire
import Synchronization

/// A running sync node: listens for peers, dials static peers, and keeps every connected
/// peer in sync with the local replica.
///
/// - On connect both sides send a hello with their causal context; each then sends the other
///   exactly what that context lacks, in chunks (full state for a new peer).
/// - ``broadcast(_:)`` ships a committed local delta to every peer at once; a delta received
///   from one peer is applied and forwarded to the peers that lack it (A–B–C converge without
///   an A–C link).
/// - When a session is quiet, both sides exchange acks and digests; equal digests mean converged.
/// - A peer silent for ``Configuration/deadPeerTimeout`` is dropped; static peers are redialed
///   with exponential backoff and jitter. Of two connections between the same pair, the one
///   dialed by the lower replica ID survives.
public actor SyncNode {
    public struct Configuration: Sendable {
        public var name: String
        public var listenHost: String
        /// 0 picks a free port; ``SyncNode/start()`` returns it.
        public var listenPort: Int
        public var security: SessionSecurity
        /// Peers whose wall clock differs by more are refused at hello.
        public var maxClockSkew: Duration
        public var keepaliveInterval: Duration
        public var deadPeerTimeout: Duration
        /// A quiet session exchanges acks and digests after this long.
        public var digestQuietPeriod: Duration
        public var reconnectBackoff: (first: Duration, max: Duration)
        /// Wall clock in ms since 1970 (tests inject skew).
        public var wallClock: @Sendable () -> UInt64
        /// How changes travel. `.deltas` (the default): catch-up of what the peer lacks, then
        /// deltas. `.fullState`: every catch-up and every change ships the whole state — the
        /// classic state-based CRDT, kept as a switch on the same code path for benchmarks.
        public var transfer: Transfer

        public enum Transfer: Sendable { case deltas, fullState }

        public init(
            name: String, listenHost: String = "127.0.0.1", listenPort: Int = 0, security: SessionSecurity,
            maxClockSkew: Duration = .seconds(300), keepaliveInterval: Duration = .seconds(1),
            deadPeerTimeout: Duration = .seconds(5), digestQuietPeriod: Duration = .milliseconds(200),
            reconnectBackoff: (first: Duration, max: Duration) = (.milliseconds(200), .seconds(5)),
            wallClock: @escaping @Sendable () -> UInt64 = HybridLogicalClock.wallClock,
            transfer: Transfer = .deltas
        ) {
            self.name = name
            self.listenHost = listenHost
            self.listenPort = listenPort
            self.security = security
            self.maxClockSkew = maxClockSkew
            self.keepaliveInterval = keepaliveInterval
            self.deadPeerTimeout = deadPeerTimeout
            self.digestQuietPeriod = digestQuietPeriod
            self.reconnectBackoff = reconnectBackoff
            self.wallClock = wallClock
            self.transfer = transfer
        }
    }

    /// Catch-up chunks received in a row are committed in one transaction up to this many records.
    static let catchUpBatchRecords = 50_000

    public nonisolated let configuration: Configuration
    nonisolated let storage: any SyncStorage
    nonisolated let logger: Logger
    nonisolated let replicaID: ReplicaID
    private nonisolated let tls: TLSContexts?
    private nonisolated let eventSink: Mutex<[UInt64: AsyncStream<NodeEvent>.Continuation]> = Mutex([:])
    private nonisolated let nextConnection = Atomic<UInt64>(1)

    private var sessions: [UInt64: SessionHandle] = [:]
    /// Established sessions by peer replica.
    private var established: [ReplicaID: SessionHandle] = [:]
    private var server: NIOAsyncChannel<NIOAsyncChannel<InboundFrame, ByteBuffer>, Never>?
    private var tasks: [Task<Void, Never>] = []
    private var channels: [UInt64: any Channel] = [:]
    private var addressReplica: [String: ReplicaID] = [:]
    private var stopped = false
    private var closedTraffic = TrafficCounters()

    /// - Throws: if the TLS contexts cannot be built from the secret.
    public init(storage: any SyncStorage, replicaID: ReplicaID, configuration: Configuration, logger: Logger) throws {
        self.storage = storage
        self.replicaID = replicaID
        self.configuration = configuration
        var logger = logger
        logger[metadataKey: "replica"] = "\(replicaID.shortDescription)"
        if configuration.security.isInsecure { logger[metadataKey: "security"] = "INSECURE" }
        self.logger = logger
        if case .groupSecret(let secret) = configuration.security {
            tls = try TLSContexts(secret: secret)
        } else {
            tls = nil
        }
    }

    // MARK: - Events

    /// A stream of what the node does. Each call makes a new subscriber.
    public nonisolated func events() -> AsyncStream<NodeEvent> {
        let (stream, continuation) = AsyncStream<NodeEvent>.makeStream(bufferingPolicy: .bufferingNewest(10_000))
        let id = nextConnection.wrappingAdd(1, ordering: .relaxed).oldValue | (1 << 63)
        eventSink.withLock { $0[id] = continuation }
        continuation.onTermination = { [weak self] _ in
            _ = self?.eventSink.withLock { $0.removeValue(forKey: id) }
        }
        return stream
    }

    private nonisolated func emit(_ event: NodeEvent) {
        for continuation in eventSink.withLock({ Array($0.values) }) { continuation.yield(event) }
    }

    // MARK: - Lifecycle

    /// Starts listening. Returns the bound port.
    @discardableResult
    public func start() async throws -> Int {
        if configuration.security.isInsecure {
            logger.warning("INSECURE mode: sessions are plain TCP, anyone on the network can read and change the data")
        }
        let maxFrame = WireLimits.defaultMaxFrameBytes
        let tls = self.tls
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .bind(host: configuration.listenHost, port: configuration.listenPort) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try Self.configurePipeline(channel, tls: tls?.server, dialed: false, maxFrame: maxFrame)
                }
            }
        self.server = server
        let port = server.channel.localAddress?.port ?? configuration.listenPort
        logger.info("listening", metadata: ["listen.port": "\(port)", "listen.host": "\(configuration.listenHost)"])
        emit(.listening(port: port))
        tasks.append(Task { await self.acceptLoop(server) })
        return port
    }

    /// Dials `host:port` now and again whenever the session ends, with backoff and jitter,
    /// until the node stops.
    public func addPeer(host: String, port: Int) {
        tasks.append(Task { await self.dialLoop(host: host, port: port) })
    }

    /// Closes every session (with a goodbye) and the listener.
    public func stop() async {
        guard !stopped else { return }
        stopped = true
        for handle in sessions.values {
            handle.setCloseReason("node shutting down")
            handle.outbox.push(.message(.goodbye(.shuttingDown, "node shutting down")))
            handle.outbox.finish()
        }
        for task in tasks { task.cancel() }
        try? await server?.channel.close()
        for channel in channels.values { try? await channel.close() }
        for task in tasks { await task.value }
        tasks = []
        for continuation in eventSink.withLock({ Array($0.values) }) { continuation.finish() }
        logger.info("stopped")
    }

    // MARK: - Local changes

    /// Ships a committed local delta to every connected peer.
    public func broadcast(_ delta: RecordMap) {
        let full = configuration.transfer == .fullState ? storage.snapshot().records : nil
        for handle in established.values {
            handle.noteChanged()
            handle.outbox.push(full.map { .catchUp($0) } ?? .delta(delta))
        }
    }

    /// Sends every peer what it lacks according to what it is known to have (after a local
    /// reload, e.g. when another process rewrote much of the store).
    public func resyncAll() {
        let state = storage.snapshot()
        for handle in established.values {
            handle.noteChanged()
            handle.outbox.push(.catchUp(state.delta(missingFrom: handle.delivered)))
        }
    }

    // MARK: - Status

    public func peers() -> [PeerStatus] {
        established.values.compactMap { handle in
            handle.info.map {
                PeerStatus(info: $0, lastConvergedAt: handle.lastConvergedAt,
                           bytesSent: handle.counter.written, bytesReceived: handle.counter.read)
            }
        }.sorted { $0.info.replicaID < $1.info.replicaID }
    }

    /// Totals over every session this node has had.
    public func traffic() -> TrafficCounters {
        var total = closedTraffic
        for handle in sessions.values { add(handle, to: &total) }
        return total
    }

    private func add(_ handle: SessionHandle, to total: inout TrafficCounters) {
        total.bytesSent += handle.counter.written
        total.bytesReceived += handle.counter.read
        total.framesSent += handle.frames.sent
        total.framesReceived += handle.frames.received
    }

    // MARK: - Connections

    static func configurePipeline(_ channel: any Channel, tls: NIOSSLContext?, dialed: Bool, maxFrame: Int) throws
        -> NIOAsyncChannel<InboundFrame, ByteBuffer>
    {
        let counter = ByteCounter()
        try channel.pipeline.syncOperations.addHandler(counter, name: "bytes")
        if let tls {
            if dialed {
                try channel.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: tls, serverHostname: nil))
            } else {
                try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: tls))
            }
        }
        try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(FrameDecoder(maxFrameBytes: maxFrame)))
        return try NIOAsyncChannel(wrappingChannelSynchronously: channel)
    }

    private func acceptLoop(_ server: NIOAsyncChannel<NIOAsyncChannel<InboundFrame, ByteBuffer>, Never>) async {
        do {
            try await withThrowingDiscardingTaskGroup { group in
                try await server.executeThenClose { inbound in
                    for try await child in inbound {
                        let address = child.channel.remoteAddress.map { "\($0.ipAddress ?? "?"):\($0.port ?? 0)" } ?? "?"
                        group.addTask { await self.runSession(child, dialed: false, address: address) }
                    }
                }
            }
        } catch {
            if !stopped { logger.error("listener failed", metadata: ["error": "\(error)"]) }
        }
    }

    private func dialLoop(host: String, port: Int) async {
        var backoff = configuration.reconnectBackoff.first
        let address = "\(host):\(port)"
        while !stopped && !Task.isCancelled {
            if let replica = addressReplica[address], established[replica] != nil {
                // Connected the other way round; look again later.
                try? await Task.sleep(for: configuration.reconnectBackoff.max)
                continue
            }
            let started = configuration.wallClock()
            await dial(host: host, port: port)
            if stopped || Task.isCancelled { break }
            if configuration.wallClock() - started > 10_000 { backoff = configuration.reconnectBackoff.first }
            let jitter = Double.random(in: 0.8...1.2)
            try? await Task.sleep(for: backoff * jitter)
            backoff = min(backoff * 2, configuration.reconnectBackoff.max)
        }
    }

    private func dial(host: String, port: Int) async {
        let address = "\(host):\(port)"
        let tls = self.tls
        do {
            let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .connectTimeout(.seconds(3))
                .channelOption(.socketOption(.tcp_nodelay), value: 1)
                .connect(host: host, port: port) { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try Self.configurePipeline(channel, tls: tls?.client, dialed: true, maxFrame: WireLimits.defaultMaxFrameBytes)
                    }
                }
            await runSession(channel, dialed: true, address: address)
        } catch {
            logger.debug("dial failed", metadata: ["peer.address": "\(address)", "error": "\(error)"])
            emit(.sessionRefused(address: address, reason: "cannot connect: \(error)"))
        }
    }

    // MARK: - One session

    private func runSession(_ channel: NIOAsyncChannel<InboundFrame, ByteBuffer>, dialed: Bool, address: String) async {
        guard !stopped else {
            try? await channel.channel.close()
            return
        }
        let counter = try? await channel.channel.pipeline.handler(type: ByteCounter.self).get()
        let now = configuration.wallClock()
        let handle = SessionHandle(
            connectionID: nextConnection.wrappingAdd(1, ordering: .relaxed).oldValue,
            address: address, dialed: dialed, counter: counter ?? ByteCounter(), now: now)
        sessions[handle.connectionID] = handle
        channels[handle.connectionID] = channel.channel
        let snapshot = storage.snapshot()
        let hello = Hello(replicaID: replicaID, name: configuration.name, wallClockMilliseconds: now,
                          context: snapshot.context, digest: snapshot.digest)
        handle.outbox.push(.message(.hello(hello)))
        var sessionLogger = logger
        sessionLogger[metadataKey: "peer.address"] = "\(address)"
        let log = sessionLogger
        do {
            try await channel.executeThenClose { inbound, outbound in
                let keepalive = Task { await self.keepalive(handle, channel: channel.channel) }
                await withTaskGroup(of: Void.self) { group in
                    group.addTask {
                        await self.writeLoop(handle, outbound: outbound, dictionary: WireDictionary(startingAt: now), channel: channel.channel)
                    }
                    await self.readLoop(handle, inbound: inbound, logger: log)
                    handle.outbox.finish()
                    keepalive.cancel()
                    // Give the writer a moment to flush a goodbye or error, then cut the connection.
                    let drain = Task {
                        try? await Task.sleep(for: .seconds(2))
                        try? await channel.channel.close()
                    }
                    await group.waitForAll()
                    drain.cancel()
                }
                await keepalive.value
            }
        } catch {
            handle.setCloseReason("\(error)")
        }
        unregister(handle)
    }

    private func readLoop(_ handle: SessionHandle, inbound: NIOAsyncChannelInboundStream<InboundFrame>, logger: Logger) async {
        var machine = SessionStateMachine(localReplica: replicaID,
                                          maxClockSkewMilliseconds: UInt64(configuration.maxClockSkew.components.seconds * 1000))
        do {
            for try await frame in inbound {
                let now = configuration.wallClock()
                handle.noteReceived(now: now)
                for action in machine.receive(type: frame.type, body: frame.body, now: now) {
                    if await !perform(action, handle: handle, logger: logger) { return }
                }
            }
            // Over TLS, an end of stream before the peer's hello means the handshake was refused
            // or cut off (a server refusing our key just closes): say so, not "closed".
            handle.setCloseReason(handle.peer == nil && tls != nil
                ? "TLS handshake failed or was cut off before the peer's hello (wrong group secret, or not a PeerSync node)"
                : "peer closed the connection")
        } catch {
            handle.setCloseReason(Self.describe(error))
        }
    }

    /// Carries out one action; false ends the session.
    private func perform(_ action: SessionStateMachine.Action, handle: SessionHandle, logger: Logger) async -> Bool {
        switch action {
        case .send(let message):
            handle.outbox.push(.message(message))
        case .established(let hello):
            return register(handle, hello: hello, logger: logger)
        case .applyChunk(let delta, let index, let count, let records):
            // Consecutive chunks commit together (up to catchUpBatchRecords): one transaction
            // dirties each b-tree page once instead of once per chunk. Nothing is acked before
            // the last chunk, so a batch lost to a crash is simply sent again.
            let last = index + 1 == count
            if let batch = handle.batchCatchUp(delta, flush: last, limit: Self.catchUpBatchRecords) {
                guard apply(batch, from: handle, logger: logger) else { return false }
            }
            if let info = handle.info {
                emit(.catchUpProgress(info, chunk: Int(index) + 1, chunks: Int(count), records: Int(records)))
            }
            if last {
                handle.outbox.push(.message(ack()))
            }
        case .applyDelta(let delta):
            guard apply([delta], from: handle, logger: logger) else { return false }
        case .acked(let context, let neighbors):
            handle.noteDelivered(context)
            if let neighbors { handle.neighbors = Set(neighbors) }
        case .digest(let digest, _):
            let local = storage.snapshot()
            if digest == local.digest {
                handle.noteConverged(now: configuration.wallClock())
                if let info = handle.info { emit(.converged(info, digest: digest)) }
            } else {
                handle.noteChanged()
            }
        case .close(let reason, let text, let notify):
            if notify {
                handle.outbox.push(.message(.error(reason, text)))
                logger.warning("closing session: \(reason)", metadata: ["reason": "\(text)"])
            } else {
                logger.info("peer closed the session: \(reason)", metadata: ["reason": "\(text)"])
            }
            handle.setCloseReason(text)
            if handle.peer == nil {
                emit(.sessionRefused(address: handle.address, reason: text))
            }
            return false
        }
        return true
    }

    /// Admits an established session (duplicate rule), and queues the catch-up.
    private func register(_ handle: SessionHandle, hello: Hello, logger: Logger) -> Bool {
        if let existing = established[hello.replicaID] {
            let newDialer = handle.dialed ? replicaID : hello.replicaID
            let oldDialer = existing.dialed ? replicaID : hello.replicaID
            let keepNew = newDialer == oldDialer ? true : newDialer < oldDialer
            let loser = keepNew ? existing : handle
            loser.setCloseReason("duplicate connection")
            loser.outbox.push(.message(.goodbye(.duplicateConnection, "another connection to this peer is kept")))
            if !keepNew { return false }
            established[hello.replicaID] = nil
            loser.outbox.finish()
            if let channel = channels[loser.connectionID] {
                channel.eventLoop.scheduleTask(in: .milliseconds(200)) { channel.close(promise: nil) }
            }
        }
        handle.established(hello)
        established[hello.replicaID] = handle
        announceNeighbors()
        addressReplica[handle.address] = hello.replicaID
        let state = storage.snapshot()
        handle.outbox.push(.catchUp(state.delta(missingFrom: configuration.transfer == .fullState ? CausalContext() : hello.context)))
        if let info = handle.info {
            logger.info("peer connected", metadata: ["peer.id": "\(hello.replicaID.shortDescription)", "peer.name": "\(hello.name)",
                                                     "peer.dialed": "\(handle.dialed)"])
            emit(.peerConnected(info))
        }
        return true
    }

    /// Applies a peer's deltas durably (one transaction) and forwards them to the peers that lack them.
    private func apply(_ deltas: [RecordMap], from source: SessionHandle, logger: Logger) -> Bool {
        let before = storage.snapshot().context
        let outcome: MergeOutcome
        do {
            outcome = try storage.applyRemote(deltas, from: "peer:\(source.peer?.replicaID.shortDescription ?? "?")")
        } catch {
            logger.error("cannot store a delta from a peer; closing the session", metadata: ["error": "\(error)"])
            source.setCloseReason("local storage failed: \(error)")
            return false
        }
        source.noteChanged()
        for delta in deltas {
            source.noteDelivered(delta.context)
            let grew = !before.includes(delta.context)
            guard !outcome.isEmpty || grew else { continue }
            let origins = delta.context.replicas
            for other in established.values where other !== source {
                if !delta.context.isEmpty && other.delivered.includes(delta.context) { continue }
                // Whoever made the delta reaches `other` directly: do not send it again.
                if !origins.isEmpty, let peer = other.peer?.replicaID,
                   origins.allSatisfy({ $0 == peer || (other.neighbors?.contains($0) ?? false) }) { continue }
                other.noteChanged()
                other.outbox.push(configuration.transfer == .fullState ? .catchUp(storage.snapshot().records) : .delta(delta))
            }
        }
        if !outcome.isEmpty, let info = source.info { emit(.remoteChange(outcome, from: info)) }
        return true
    }

    private func unregister(_ handle: SessionHandle) {
        sessions[handle.connectionID] = nil
        channels[handle.connectionID] = nil
        add(handle, to: &closedTraffic)
        if let peer = handle.peer, established[peer.replicaID] === handle {
            established[peer.replicaID] = nil
            announceNeighbors()
        }
        if let info = handle.info {
            let reason = handle.closeReason ?? "closed"
            logger.info("peer disconnected", metadata: ["peer.id": "\(info.replicaID.shortDescription)", "reason": "\(reason)"])
            emit(.peerDisconnected(info, reason: reason))
        } else if let reason = handle.closeReason, reason != "duplicate connection" {
            emit(.sessionRefused(address: handle.address, reason: reason))
        }
    }

    /// The replicas this node has established sessions with.
    private func neighborList() -> [ReplicaID] { established.keys.sorted() }

    private func ack() -> Message { .ack(storage.snapshot().context, neighbors: neighborList()) }

    /// Tells every peer whom this node is connected to now, so they forward only what it lacks.
    private func announceNeighbors() {
        let message = ack()
        for handle in established.values { handle.outbox.push(.message(message)) }
    }

    // MARK: - Writer and keepalive

    private nonisolated func writeLoop(
        _ handle: SessionHandle, outbound: NIOAsyncChannelOutboundWriter<ByteBuffer>, dictionary: WireDictionary,
        channel: any Channel
    ) async {
        let allocator = channel.allocator
        do {
            while let (items, resync) = await handle.outbox.next() {
                var frames: [[UInt8]] = []
                var pendingDelta: RecordMap?
                func flushDelta() {
                    if let delta = pendingDelta {
                        frames.append(Message.delta(WireDelta.encode(delta, with: dictionary)).encodedFrame())
                        handle.noteDelivered(delta.context)
                        pendingDelta = nil
                    }
                }
                if resync, handle.peer != nil {
                    let extract = storage.snapshot().delta(missingFrom: handle.delivered)
                    pendingDelta = extract
                }
                for item in items {
                    switch item {
                    case .delta(let delta):
                        if pendingDelta == nil { pendingDelta = delta } else { pendingDelta!.merge(delta) }
                    case .message(let message):
                        flushDelta()
                        frames.append(message.encodedFrame())
                    case .catchUp(let state):
                        flushDelta()
                        let records = state.allRecords
                        let bounds = state.chunkBounds(records, targetBytes: WireLimits.chunkTargetBytes)
                        for (index, range) in bounds.enumerated() {
                            let last = index + 1 == bounds.count
                            let payload = WireDelta.encode(records: records[range], context: last ? state.context : CausalContext(),
                                                           with: dictionary)
                            frames.append(Message.chunk(index: UInt64(index), count: UInt64(bounds.count),
                                                        records: UInt64(range.count), delta: payload).encodedFrame())
                            if frames.count >= 4 {
                                try await write(frames, outbound, allocator, handle)
                                frames = []
                            }
                        }
                        handle.noteDelivered(state.context)
                    }
                }
                flushDelta()
                if !frames.isEmpty { try await write(frames, outbound, allocator, handle) }
            }
        } catch {
            // A write to a channel that is already closing is a consequence, not the cause: leave
            // the reason to the reader, which sees why (TLS refusal, end of stream, bad frame).
            if !(error is ChannelError) { handle.setCloseReason("write failed: \(Self.describe(error))") }
            try? await channel.close()
        }
    }

    private nonisolated func write(
        _ frames: [[UInt8]], _ outbound: NIOAsyncChannelOutboundWriter<ByteBuffer>, _ allocator: ByteBufferAllocator,
        _ handle: SessionHandle
    ) async throws {
        var buffer = allocator.buffer(capacity: frames.reduce(0) { $0 + $1.count })
        for frame in frames { buffer.writeBytes(frame) }
        try await outbound.write(buffer)
        for _ in frames { handle.noteSent(now: configuration.wallClock()) }
    }

    private nonisolated func keepalive(_ handle: SessionHandle, channel: any Channel) async {
        let tick = Duration.milliseconds(100)
        let interval = UInt64(configuration.keepaliveInterval.components.seconds * 1000
            + configuration.keepaliveInterval.components.attoseconds / 1_000_000_000_000_000)
        let dead = UInt64(configuration.deadPeerTimeout.components.seconds * 1000
            + configuration.deadPeerTimeout.components.attoseconds / 1_000_000_000_000_000)
        let quiet = UInt64(configuration.digestQuietPeriod.components.seconds * 1000
            + configuration.digestQuietPeriod.components.attoseconds / 1_000_000_000_000_000)
        var nonce: UInt64 = 0
        while !Task.isCancelled {
            do { try await Task.sleep(for: tick) } catch { return }
            let now = configuration.wallClock()
            let silence = handle.silence(now: now)
            if silence.received >= dead {
                handle.setCloseReason(handle.peer == nil ? "no hello within \(dead / 1000) s" : "peer silent for \(silence.received / 1000) s")
                try? await channel.close()
                return
            }
            if handle.takeDigestDue(now: now, quiet: quiet) {
                let state = storage.snapshot()
                handle.outbox.push(.message(.ack(state.context, neighbors: await neighborList())))
                handle.outbox.push(.message(.digest(state.digest, records: UInt64(state.records.recordCount))))
            } else if silence.sent >= interval, handle.peer != nil {
                nonce += 1
                handle.outbox.push(.message(.ping(nonce)))
            }
        }
    }

    static func describe(_ error: any Error) -> String {
        if let error = error as? NIOSSLError {
            return "TLS handshake failed (wrong group secret, or not a PeerSync node): \(error)"
        }
        if let error = error as? BoringSSLError {
            return "TLS handshake failed (wrong group secret, or not a PeerSync node): \(error)"
        }
        if let error = error as? WireError { return "\(error)" }
        if let error = error as? ByteToMessageDecoderError { return "bad frame: \(error)" }
        return "\(error)"
    }
}
