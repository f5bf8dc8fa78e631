import Logging
import NIOCore
import NIOPosix
import NIOSSL
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncRelay
import PeerSyncReplication
import PeerSyncWire
import Synchronization

/// The relay's network side (`peersync relay`): a TCP listener with mutual TLS — any device
/// certificate completes the handshake, membership is the service's to check on the first
/// message — moving frames between each connection and the ``RelayService``.
package actor RelayServer {
    public nonisolated let service: RelayService
    private let listen: PeerAddress
    private let timing: SyncTiming
    private let limits: SyncLimits
    private let logger: Logger
    private let tls: DeviceTLS
    private var server: NIOAsyncChannel<(NIOAsyncChannel<[InboundFrame], ByteBuffer>, TLSPeer?), Never>?
    private var acceptTask: Task<Void, Never>?
    private nonisolated let accepted = AcceptedChannels()
    private var channels: [ObjectIdentifier: any Channel] = [:]
    private var stopped = false
    /// Connections over the relay's total or per-address limit are closed on arrival.
    private nonisolated let inbound: InboundLimiter

    public init(service: RelayService, listen: PeerAddress, timing: SyncTiming = SyncTiming(), limits: SyncLimits = SyncLimits(),
                logger: Logger = Logger(label: "peersync.relay")) throws {
        self.service = service
        self.listen = listen
        self.timing = timing
        self.limits = limits
        self.logger = logger
        tls = try DeviceTLS(key: service.key, admit: { _ in true })
        var gate = limits
        gate.inboundConnections = limits.relayConnections
        gate.inboundConnectionsPerAddress = limits.relayConnectionsPerAddress
        inbound = InboundLimiter(limits: gate) { report in
            logger.warning("relay connections refused over the limits", metadata: ["refused": "\(report)"])
        }
    }

    /// Binds and starts accepting; returns the bound port.
    public func start() async throws -> UInt16 {
        let tls = self.tls
        let maxFrame = limits.maxFrameBytes
        let accepted = self.accepted
        let inbound = self.inbound
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .serverChannelOption(.backlog, value: 1024)
            .serverChannelInitializer { channel in
                // Before the accept handler: a connection over a limit never gets a pipeline.
                channel.eventLoop.makeCompletedFuture { try channel.pipeline.syncOperations.addHandler(InboundGate(inbound)) }
            }
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .bind(host: listen.host, port: Int(listen.port)) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try accepted.register { try SyncNode.configurePipeline(channel, tls: tls, dialed: false, maxFrame: maxFrame) }
                }
            }
        self.server = server
        let port = UInt16(server.channel.localAddress?.port ?? Int(listen.port))
        logger.info("relay listening", metadata: ["listen.port": "\(port)", "listen.host": "\(listen.host)"])
        acceptTask = Task { await self.acceptLoop(server) }
        return port
    }

    public func stop() async {
        guard !stopped else { return }
        stopped = true
        try? await server?.channel.close()
        for channel in channels.values { try? await channel.close() }
        await acceptTask?.value
        for leftover in accepted.close() { try? await leftover.executeThenClose { _, _ in } }
    }

    private func acceptLoop(_ server: NIOAsyncChannel<(NIOAsyncChannel<[InboundFrame], ByteBuffer>, TLSPeer?), Never>) async {
        do {
            try await withThrowingDiscardingTaskGroup { group in
                try await server.executeThenClose { inbound in
                    for try await (child, peer) in inbound {
                        accepted.take(child)
                        group.addTask { await self.run(child, tls: peer) }
                    }
                }
            }
        } catch {
            if !stopped { logger.error("relay listener failed", metadata: ["error": "\(error)"]) }
        }
    }

    private func track(_ channel: any Channel) -> Bool {
        guard !stopped else { return false }
        channels[ObjectIdentifier(channel)] = channel
        return true
    }

    private func untrack(_ channel: any Channel) { channels[ObjectIdentifier(channel)] = nil }

    private func run(_ channel: NIOAsyncChannel<[InboundFrame], ByteBuffer>, tls: TLSPeer?) async {
        let raw = channel.channel
        guard track(raw) else {
            try? await channel.executeThenClose { _, _ in }
            return
        }
        defer { untrack(raw) }
        // A stranger costs a handshake and one refusal; one that says nothing is closed after
        // the handshake timeout.
        let timeout = timing.handshakeTimeout
        let deadline = raw.eventLoop.scheduleTask(in: .milliseconds(timeout.wholeMilliseconds)) { raw.close(promise: nil) }
        let device: DeviceID
        do {
            guard let tls else { throw DeviceTLSError.closedBeforeHandshake }
            device = try await tls.authenticated.get()
        } catch {
            deadline.cancel()
            try? await channel.executeThenClose { _, _ in }
            return
        }
        let client = NIORelayClient(channel: raw, device: device, maxQueued: limits.outboxDeltaBytes)
        guard await service.opened(client) else {
            deadline.cancel()
            try? await channel.executeThenClose { _, outbound in outbound.finish() }
            return
        }
        let service = self.service
        let greeting = raw.eventLoop.scheduleTask(in: .milliseconds(timeout.wholeMilliseconds)) {
            Task { if await !service.greeted(client) { client.close() } }
        }
        deadline.cancel()
        do {
            try await channel.executeThenClose { inbound, outbound in
                loop: for try await frames in inbound {
                    let replies = await service.received(frames.map { (type: $0.type, body: $0.body) }, from: client)
                    for reply in replies {
                        switch reply {
                        case .send(let frame):
                            try await outbound.write(raw.allocator.buffer(bytes: frame))
                        case .stream(_, let ids, let then):
                            for start in stride(from: 0, to: ids.count, by: 64) {
                                let part = Array(ids[start..<min(start + 64, ids.count)])
                                let found = try service.blobBytes(part)
                                for id in part {
                                    guard let bytes = found[id] else { continue }  // dropped by a snapshot meanwhile
                                    try await outbound.write(raw.allocator.buffer(bytes: Frame.encode(type: RelayMessage.Kind.blob.rawValue, body: bytes)))
                                }
                            }
                            try await outbound.write(raw.allocator.buffer(bytes: then))
                        case .close:
                            break loop
                        }
                    }
                }
            }
        } catch {
            logger.debug("relay connection ended", metadata: ["device": "\(device.shortForm)", "error": "\(error)"])
        }
        greeting.cancel()
        await service.closed(client)
    }
}

/// A device's connection as the service sees it: forwarded frames go straight to the channel,
/// bounded by the bytes not yet written.
final class NIORelayClient: RelayClient {
    let device: DeviceID
    private let channel: any Channel
    private let queued = Mutex(0)
    private let maxQueued: Int

    init(channel: any Channel, device: DeviceID, maxQueued: Int) {
        self.channel = channel
        self.device = device
        self.maxQueued = maxQueued
    }

    func offer(_ frame: [UInt8]) {
        let over = queued.withLock { queued in
            queued += frame.count
            return queued > maxQueued
        }
        guard !over else {
            // Too slow to take what its group writes: it reconnects and catches up from storage.
            channel.close(promise: nil)
            return
        }
        let count = frame.count
        let promise = channel.eventLoop.makePromise(of: Void.self)
        promise.futureResult.whenComplete { _ in self.queued.withLock { $0 -= count } }
        channel.writeAndFlush(channel.allocator.buffer(bytes: frame), promise: promise)
    }

    func close() { channel.close(promise: nil) }
}

/// A device's side of a relay connection: dial, mutual TLS (expecting the relay's device ID
/// when known), then `body` with the frames read and a writer, until either ends.
package enum RelayDial {
    /// Reads frames one batch at a time.
    package struct Reader {
        var iterator: NIOAsyncChannelInboundStream<[InboundFrame]>.AsyncIterator
        /// The next batch of frames; nil when the relay closed.
        nonisolated(nonsending) package mutating func next() async throws -> [(type: UInt8, body: [UInt8])]? {
            try await iterator.next(isolation: #isolation)?.map { (type: $0.type, body: $0.body) }
        }
    }

    /// Writes frames.
    package struct Writer: Sendable {
        let outbound: NIOAsyncChannelOutboundWriter<ByteBuffer>
        let allocator: ByteBufferAllocator
        let channel: any Channel
        package func write(_ frame: [UInt8]) async throws { try await outbound.write(allocator.buffer(bytes: frame)) }
        package func close() { channel.close(promise: nil) }
    }

    /// Connects to `address` as `key`'s device and runs `body`; the relay must be `expecting`
    /// (its device ID) when given.
    nonisolated(nonsending) package static func run<T: Sendable>(
        _ address: PeerAddress, key: DeviceKey, expecting: DeviceID?, timing: SyncTiming = SyncTiming(),
        maxFrame: Int = WireLimits.defaultMaxFrameBytes,
        body: (DevicePublicKey, inout Reader, Writer) async throws -> T
    ) async throws -> T {
        let tls = try DeviceTLS(key: key, admit: { _ in true })
        let (channel, peer) = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(.seconds(3))
            .channelOption(.socketOption(.tcp_nodelay), value: 1)
            .connect(host: address.host, port: Int(address.port)) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(ByteCounter(), name: "bytes")
                    let peer = try tls.configure(channel, dialed: true, expecting: expecting)
                    try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(FrameDecoder(maxFrameBytes: maxFrame)))
                    try channel.pipeline.syncOperations.addHandler(FrameBatcher())
                    return (try NIOAsyncChannel<[InboundFrame], ByteBuffer>(wrappingChannelSynchronously: channel), peer)
                }
            }
        let raw = channel.channel
        let timeout = raw.eventLoop.scheduleTask(in: .milliseconds(timing.handshakeTimeout.wholeMilliseconds)) { raw.close(promise: nil) }
        let relayKey: DevicePublicKey
        do {
            _ = try await peer.authenticated.get()
            relayKey = try await raw.eventLoop.submit {
                let handler = try raw.pipeline.syncOperations.handler(type: NIOSSLHandler.self)
                guard let certificate = handler.peerCertificate else { throw DeviceTLSError.closedBeforeHandshake }
                return try DevicePublicKey(certificateDER: certificate.toDERBytes())
            }.get()
        } catch {
            timeout.cancel()
            try? await channel.executeThenClose { _, _ in }
            throw error
        }
        timeout.cancel()
        return try await channel.executeThenClose { inbound, outbound in
            var reader = Reader(iterator: inbound.makeAsyncIterator())
            return try await body(relayKey, &reader, Writer(outbound: outbound, allocator: raw.allocator, channel: raw))
        }
    }
}
