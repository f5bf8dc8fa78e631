import Foundation
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS
import PeerSync
import Synchronization

// TLS handshake cost in a release build (issue 12 needs it; DeviceTLSTests.handshakeCost measures
// the same in debug): mutual TLS 1.3 with device certificates, as sessions use now, against
// TLS 1.2 ECDHE-PSK, as protocol-1 sessions did. Loopback, one connection at a time.

/// Counts bytes at the socket end of a pipeline.
private final class Counter: ChannelDuplexHandler, Sendable {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    let counts = Mutex((read: 0, written: 0))

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

/// Server side: echoes what it reads.
private final class Echo: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        context.writeAndFlush(data, promise: nil)
    }
}

/// Client side: once the handshake completes, notes the time and sends one byte; completes
/// `done` when it comes back.
private final class Probe: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer
    let done: EventLoopPromise<(handshake: ContinuousClock.Instant, echo: ContinuousClock.Instant)>
    var handshake: ContinuousClock.Instant?

    init(done: EventLoopPromise<(handshake: ContinuousClock.Instant, echo: ContinuousClock.Instant)>) { self.done = done }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? TLSUserEvent, case .handshakeCompleted = event, handshake == nil {
            handshake = .now
            context.writeAndFlush(wrapOutboundOut(context.channel.allocator.buffer(string: "x")), promise: nil)
        }
        context.fireUserInboundEventTriggered(event)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        if let handshake { done.succeed((handshake, .now)) }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        done.fail(error)
        context.close(promise: nil)
    }
}

enum HandshakeBenchmark {
    typealias Configure = @Sendable (any Channel, _ dialed: Bool) throws -> Void

    static let handshake = Benchmark(name: "tls-handshake") { quick in
        let rounds = quick ? 3 : 50
        let a = DeviceKey.generate()
        let b = DeviceKey.generate()
        let tlsA = try DeviceTLS(key: a) { _ in true }
        let tlsB = try DeviceTLS(key: b) { _ in true }
        let psk = try pskContexts()
        var metrics: [String: Double] = [:]
        let variants: [(String, Configure, Configure)] = [
            ("mtls13", { channel, _ in try tlsA.configure(channel, dialed: false) }, { channel, _ in try tlsB.configure(channel, dialed: true) }),
            ("psk12", { channel, _ in try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: psk.server)) },
             { channel, _ in try channel.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: psk.client, serverHostname: nil)) }),
        ]
        for (name, server, client) in variants {
            let m = try await measure(rounds: rounds, server: server, client: client)
            metrics["\(name)_handshake_ms"] = m.handshake
            metrics["\(name)_first_echo_ms"] = m.echo
            metrics["\(name)_bytes"] = Double(m.bytes)
            metrics["\(name)_client_sent"] = Double(m.sent)
            metrics["\(name)_client_received"] = Double(m.received)
        }
        return Result(name: "tls-handshake",
                      detail: "loopback, median of \(rounds) after a warm-up: mutual TLS 1.3 with device certificates (NIOSSL default groups: X25519MLKEM768 first) vs TLS 1.2 ECDHE-PSK-CHACHA20-POLY1305; connect → handshake complete; → first 1-byte echo; bytes both ways up to the echo",
                      metrics: metrics)
    }

    static func measure(rounds: Int, server configureServer: @escaping Configure, client configureClient: @escaping Configure) async throws
        -> (handshake: Double, echo: Double, bytes: Int, sent: Int, received: Int)
    {
        let group = MultiThreadedEventLoopGroup.singleton
        let server = try await ServerBootstrap(group: group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try configureServer(channel, false)
                    try channel.pipeline.syncOperations.addHandler(Echo())
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        defer { server.close(promise: nil) }
        let port = server.localAddress!.port!
        var handshakes: [Double] = []
        var echoes: [Double] = []
        var bytes: [(Int, Int)] = []
        for round in 0...rounds {
            let promise = group.next().makePromise(of: (handshake: ContinuousClock.Instant, echo: ContinuousClock.Instant).self)
            let counter = Counter()
            let start = ContinuousClock.now
            let channel = try await ClientBootstrap(group: group)
                .channelOption(.socketOption(.tcp_nodelay), value: 1)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(counter)
                        try configureClient(channel, true)
                        try channel.pipeline.syncOperations.addHandler(Probe(done: promise))
                    }
                }
                .connect(host: "127.0.0.1", port: port).get()
            let (handshake, echo) = try await promise.futureResult.get()
            try? await channel.close()
            if round > 0 {
                handshakes.append(milliseconds(handshake - start))
                echoes.append(milliseconds(echo - start))
                bytes.append(counter.counts.withLock { ($0.written, $0.read) })
            }
        }
        let middle = rounds / 2
        let sortedBytes = bytes.sorted { $0.0 + $0.1 < $1.0 + $1.1 }[middle]
        return (handshakes.sorted()[middle], echoes.sorted()[middle], sortedBytes.0 + sortedBytes.1, sortedBytes.0, sortedBytes.1)
    }

    /// TLS 1.2 ECDHE-PSK as protocol-1 sessions configured it (Sources/PeerSyncNetwork/TLSSetup.swift).
    static func pskContexts() throws -> (client: NIOSSLContext, server: NIOSSLContext) {
        let key = (0..<32).map { UInt8($0) }
        let identity = "peersync/0123456789abcdef"
        let suites = "ECDHE-PSK-CHACHA20-POLY1305:ECDHE-PSK-AES256-CBC-SHA"
        var server = TLSConfiguration.makePreSharedKeyConfiguration()
        server.minimumTLSVersion = .tlsv12
        server.maximumTLSVersion = .tlsv12
        server.cipherSuites = suites
        server.pskHint = "peersync"
        server.pskServerProvider = { _ in
            var bytes = NIOSSLSecureBytes()
            bytes.append(contentsOf: key)
            return PSKServerIdentityResponse(key: bytes)
        }
        var client = TLSConfiguration.makePreSharedKeyConfiguration()
        client.minimumTLSVersion = .tlsv12
        client.maximumTLSVersion = .tlsv12
        client.cipherSuites = suites
        client.pskClientProvider = { _ in
            var bytes = NIOSSLSecureBytes()
            bytes.append(contentsOf: key)
            return PSKClientIdentityResponse(key: bytes, identity: identity)
        }
        return (try NIOSSLContext(configuration: client), try NIOSSLContext(configuration: server))
    }
}
