import Foundation
import NIOCore
import NIOPosix
import NIOSSL
import NIOTLS
import PeerSyncIdentity
@testable import PeerSyncReplication
@testable import PeerSyncNetwork
import PeerSyncTestSupport
import Synchronization
import Testing

struct TimedOut: Error, CustomStringConvertible {
    var description: String { "timed out" }
}

/// Runs `body`, failing with ``TimedOut`` after `seconds` (every wait in these tests is bounded).
func withDeadline<T: Sendable>(_ seconds: Double = 60, _ body: @escaping @Sendable () async throws -> T) async throws -> T {
    try await withThrowingTaskGroup(of: T.self) { group in
        group.addTask { try await body() }
        group.addTask {
            try await Task.sleep(for: .seconds(seconds))
            throw TimedOut()
        }
        defer { group.cancelAll() }
        return try await group.next()!
    }
}

/// A TLS server on 127.0.0.1 that echoes what it reads, recording each accepted peer.
final class EchoServer: Sendable {
    struct Accepted: Sendable {
        let channel: NIOAsyncChannel<ByteBuffer, ByteBuffer>
        let peer: TLSPeer?
        let counter: ByteCounter
    }

    /// The accepted connections, in order.
    final class List: Sendable {
        let items = Mutex<(accepted: [Accepted], stopping: Bool)>(([], false))
        func withLock<R>(_ body: (inout [Accepted]) -> R) -> R { items.withLock { body(&$0.accepted) } }

        /// Records `child`; false once the server is stopping (the caller closes it then).
        func add(_ child: Accepted) -> Bool {
            items.withLock { state in
                state.accepted.append(child)
                return !state.stopping
            }
        }

        /// Marks the server stopping and returns every connection recorded so far.
        func stop() -> [Accepted] {
            items.withLock { state in
                state.stopping = true
                return state.accepted
            }
        }
    }

    let port: Int
    let accepted = List()
    private let server: NIOAsyncChannel<Accepted, Never>
    private let task: Task<Void, Never>

    /// `configure` sets up TLS on each accepted channel (DeviceTLS or, for comparison, the PSK handler).
    init(_ configure: @escaping @Sendable (any Channel) throws -> TLSPeer?) async throws {
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .bind(host: "127.0.0.1", port: 0) { channel in
                channel.eventLoop.makeCompletedFuture {
                    let counter = ByteCounter()
                    try channel.pipeline.syncOperations.addHandler(counter)
                    let peer = try configure(channel)
                    return Accepted(channel: try NIOAsyncChannel(wrappingChannelSynchronously: channel), peer: peer, counter: counter)
                }
            }
        let accepted = self.accepted
        self.server = server
        port = server.channel.localAddress!.port!
        task = Task {
            try? await withThrowingDiscardingTaskGroup { group in
                try await server.executeThenClose { inbound in
                    for try await child in inbound {
                        guard accepted.add(child) else {
                            try? await child.channel.channel.close()
                            continue
                        }
                        group.addTask {
                            try? await child.channel.executeThenClose { input, output in
                                for try await buffer in input { try await output.write(buffer) }
                            }
                        }
                    }
                }
            }
        }
    }

    /// Closes the listener and every connection. The accept loop is not cancelled: it ends when
    /// the listener closes, after consuming every connection already accepted (NIO traps on an
    /// accepted channel dropped unconsumed — "Deinited NIOAsyncWriter without calling finish()").
    func stop() async {
        let open = accepted.stop()
        try? await server.channel.close()
        for child in open { try? await child.channel.channel.close() }
        await task.value
    }
}

/// One client connection: its async channel, TLS peer record and byte counter.
struct Client: Sendable {
    let channel: NIOAsyncChannel<ByteBuffer, ByteBuffer>
    let peer: TLSPeer?
    let counter: ByteCounter

    static func connect(port: Int, _ configure: @escaping @Sendable (any Channel) throws -> TLSPeer?) async throws -> Client {
        try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(.seconds(3))
            .connect(host: "127.0.0.1", port: port) { channel in
                channel.eventLoop.makeCompletedFuture {
                    let counter = ByteCounter()
                    try channel.pipeline.syncOperations.addHandler(counter)
                    let peer = try configure(channel)
                    return Client(channel: try NIOAsyncChannel(wrappingChannelSynchronously: channel), peer: peer, counter: counter)
                }
            }
    }

    /// Writes `text` and returns what comes back (nil at end of stream); throws what the read throws.
    func echo(_ text: String) async throws -> String? {
        try await channel.executeThenClose { inbound, outbound in
            try await outbound.write(ByteBuffer(string: text))
            var iterator = inbound.makeAsyncIterator()
            guard let reply = try await iterator.next() else { return nil }
            return String(buffer: reply)
        }
    }

    /// The TLS version the channel negotiated.
    func tlsVersion() async throws -> TLSVersion? {
        let channel = self.channel.channel
        return try await channel.eventLoop.submit {
            try channel.pipeline.syncOperations.handler(type: NIOSSLHandler.self).tlsVersion
        }.get()
    }
}

@Suite("DeviceTLS: mutual TLS 1.3 between devices", .serialized)
struct DeviceTLSTests {
    @Test("a closing connection waits at most 1 s for the peer's close_notify (NIOSSL's default is 5 s), both ways")
    func boundedShutdown() throws {
        let tls = try DeviceTLS(key: DeviceKey.generate()) { _ in true }
        #expect(tls.serverContext.configuration.shutdownTimeout == .seconds(1))
        #expect(tls.clientContext.configuration.shutdownTimeout == .seconds(1))
    }

    @Test("two devices that admit each other complete mutual TLS 1.3, exchange bytes and learn each other's ID")
    func mutual() async throws {
        let a = DeviceKey.generate()
        let b = DeviceKey.generate()
        let members: Set<DeviceID> = [a.deviceID, b.deviceID]
        let tlsA = try DeviceTLS(key: a) { members.contains($0) }
        let tlsB = try DeviceTLS(key: b) { members.contains($0) }
        let server = try await EchoServer { try tlsA.configure($0, dialed: false) }
        let client = try await Client.connect(port: server.port) { try tlsB.configure($0, dialed: true) }
        let clientPeer = try #require(client.peer)
        #expect(try await withDeadline { try await clientPeer.authenticated.get() } == a.deviceID)
        #expect(try await client.tlsVersion() == .tlsv13)
        try await withDeadline {
            try await client.channel.executeThenClose { inbound, outbound in
                try await outbound.write(ByteBuffer(string: "hello over TLS 1.3"))
                var iterator = inbound.makeAsyncIterator()
                let reply = try await iterator.next()
                #expect(reply.map { String(buffer: $0) } == "hello over TLS 1.3")
                // While the connection is up: the server learned the client's ID, both ways.
                let serverSide = try #require(server.accepted.withLock { $0.first })
                let serverPeer = try #require(serverSide.peer)
                #expect(try await serverPeer.authenticated.get() == b.deviceID)
                #expect(serverPeer.verdict == .admitted(b.deviceID))
                #expect(clientPeer.verdict == .admitted(a.deviceID))
                let channel = serverSide.channel.channel
                let fromPipeline = try await channel.eventLoop.submit {
                    try DeviceTLS.peerDeviceID(in: channel.pipeline.syncOperations)
                }.get()
                #expect(fromPipeline == b.deviceID)
            }
        }
        await server.stop()
    }

    @Test("a device the server does not admit is refused: the server says who, the client fails at its first read")
    func serverRefuses() async throws {
        let a = DeviceKey.generate()
        let stranger = DeviceKey.generate()
        let tlsA = try DeviceTLS(key: a) { _ in false }
        let tlsS = try DeviceTLS(key: stranger) { $0 == a.deviceID }
        let server = try await EchoServer { try tlsA.configure($0, dialed: false) }
        let client = try await Client.connect(port: server.port) { try tlsS.configure($0, dialed: true) }
        let outcome = await result { try await withDeadline { try await client.echo("let me in") } }
        // Nothing is echoed: either an error (TLS alert) or the end of the stream.
        switch outcome {
        case .success(let reply): #expect(reply == nil)
        case .failure(let error): #expect(!(error is TimedOut), "\(error)")
        }
        #expect(await eventually { server.accepted.withLock { $0.first?.peer?.verdict != nil && $0.first?.peer?.verdict != .pending } })
        let serverPeer = try #require(server.accepted.withLock { $0.first }?.peer)
        #expect(serverPeer.verdict == .refused(stranger.deviceID, reason: "not a member of this group"))
        await #expect(throws: DeviceTLSError.refused(.refused(stranger.deviceID, reason: "not a member of this group"))) {
            try await serverPeer.authenticated.get()
        }
        #expect(server.accepted.withLock { $0.first }!.counter.read > 0)
        await server.stop()
    }

    @Test("a client refuses a server it does not admit, or that is not the device it expected")
    func clientRefuses() async throws {
        let a = DeviceKey.generate()
        let b = DeviceKey.generate()
        let tlsA = try DeviceTLS(key: a) { _ in true }
        let server = try await EchoServer { try tlsA.configure($0, dialed: false) }
        let picky = try DeviceTLS(key: b) { _ in false }
        let refused = try await Client.connect(port: server.port) { try picky.configure($0, dialed: true) }
        await #expect(throws: DeviceTLSError.refused(.refused(a.deviceID, reason: "not a member of this group"))) {
            try await withDeadline { try await refused.peer!.authenticated.get() }
        }
        let other = DeviceKey.generate().deviceID
        let trusting = try DeviceTLS(key: b) { _ in true }
        let wrongDevice = try await Client.connect(port: server.port) { try trusting.configure($0, dialed: true, expecting: other) }
        await #expect(throws: DeviceTLSError.refused(.refused(a.deviceID, reason: "expected device \(other)"))) {
            try await withDeadline { try await wrongDevice.peer!.authenticated.get() }
        }
        let rightDevice = try await Client.connect(port: server.port) { try trusting.configure($0, dialed: true, expecting: a.deviceID) }
        #expect(try await withDeadline { try await rightDevice.echo("ok") } == "ok")
        try? await refused.channel.channel.close()
        try? await wrongDevice.channel.channel.close()
        await server.stop()
    }

    @Test("a peer admitted during the handshake but no longer afterwards is dropped by the post-handshake check")
    func admissionRechecked() async throws {
        let a = DeviceKey.generate()
        let b = DeviceKey.generate()
        let calls = Mutex(0)
        // Admits b only on the first question (the handshake callback); the re-check says no.
        let tlsA = try DeviceTLS(key: a) { id in
            calls.withLock { n in
                n += 1
                return n == 1 && id == b.deviceID
            }
        }
        let tlsB = try DeviceTLS(key: b) { $0 == a.deviceID }
        let server = try await EchoServer { try tlsA.configure($0, dialed: false) }
        let client = try await Client.connect(port: server.port) { try tlsB.configure($0, dialed: true) }
        let outcome = await result { try await withDeadline { try await client.echo("hi") } }
        if case .success(let reply) = outcome { #expect(reply == nil) }
        #expect(await eventually { server.accepted.withLock { !$0.isEmpty } })
        let serverPeer = try #require(server.accepted.withLock { $0.first }?.peer)
        await #expect(throws: DeviceTLSError.self) { try await serverPeer.authenticated.get() }
        #expect(calls.withLock { $0 } == 2)
        await server.stop()
    }

    /// Handshake cost on loopback, for docs/BENCHMARKS.md: median of 20 after one warm-up, and
    /// bytes on the wire (both directions, counted at the socket end, up to the first echoed
    /// byte). Prints the numbers; asserts nothing about time.
    @Test("handshake cost: mutual TLS 1.3 with device certificates vs TLS 1.2 PSK (measurement)")
    func handshakeCost() async throws {
        let a = DeviceKey.generate()
        let b = DeviceKey.generate()
        let tlsA = try DeviceTLS(key: a) { _ in true }
        let tlsB = try DeviceTLS(key: b) { _ in true }
        let psk = try TLSContexts(secret: GroupSecret.generate())

        func measure(
            server configureServer: @escaping @Sendable (any Channel) throws -> TLSPeer?,
            client configureClient: @escaping @Sendable (any Channel) throws -> TLSPeer?
        ) async throws -> (handshake: Double, echo: Double, bytes: Int, sent: Int, received: Int) {
            let server = try await EchoServer(configureServer)
            var handshakes: [Double] = []
            var echoes: [Double] = []
            var bytes: [Int] = []
            var sent = 0
            var received = 0
            for round in 0...20 {
                let start = ContinuousClock.now
                let watcher = HandshakeWatcher()
                let client = try await Client.connect(port: server.port) { channel in
                    let peer = try configureClient(channel)
                    try channel.pipeline.syncOperations.addHandler(watcher.handler(channel.eventLoop))
                    return peer
                }
                try await withDeadline { try await watcher.completed() }
                let handshake = ContinuousClock.now - start
                let reply = try await withDeadline { try await client.echo("x") }
                let echo = ContinuousClock.now - start
                #expect(reply == "x")
                if round > 0 {
                    handshakes.append(milliseconds(handshake))
                    echoes.append(milliseconds(echo))
                    bytes.append(client.counter.read + client.counter.written)
                    sent = client.counter.written
                    received = client.counter.read
                }
            }
            await server.stop()
            return (handshakes.sorted()[10], echoes.sorted()[10], bytes.sorted()[10], sent, received)
        }

        let mtls = try await measure(server: { try tlsA.configure($0, dialed: false) }, client: { try tlsB.configure($0, dialed: true) })
        let classicA = try DeviceTLS(key: a, certificate: nil, curves: [.x25519]) { _ in true }
        let classicB = try DeviceTLS(key: b, certificate: nil, curves: [.x25519]) { _ in true }
        let classic = try await measure(server: { try classicA.configure($0, dialed: false) },
                                        client: { try classicB.configure($0, dialed: true) })
        let pskCost = try await measure(
            server: { channel in
                try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: psk.server))
                return nil
            },
            client: { channel in
                try channel.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: psk.client, serverHostname: nil))
                return nil
            })
        func line(_ name: String, _ m: (handshake: Double, echo: Double, bytes: Int, sent: Int, received: Int)) -> String {
            name + ": handshake " + String(format: "%.2f", m.handshake) + " ms, first echo " + String(format: "%.2f", m.echo)
                + " ms, \(m.bytes) bytes up to the echo (client sent \(m.sent), received \(m.received))"
        }
        print("""
            handshake cost (median of 20 after a warm-up; loopback; debug build):
              \(line("mutual TLS 1.3, device certificates, default groups (X25519MLKEM768)", mtls))
              \(line("mutual TLS 1.3, device certificates, X25519 only", classic))
              \(line("TLS 1.2 ECDHE-PSK (group secret)", pskCost))
            """)
        #expect(classic.bytes < mtls.bytes) // the hybrid post-quantum key shares are what is big
        #expect(mtls.bytes > pskCost.bytes) // certificates travel; PSK sends none
    }
}

/// The outcome of `body` as a value.
func result<T>(_ body: () async throws -> T) async -> Result<T, any Error> {
    do {
        return .success(try await body())
    } catch {
        return .failure(error)
    }
}

func milliseconds(_ duration: Duration) -> Double {
    Double(duration.components.seconds) * 1_000 + Double(duration.components.attoseconds) / 1e15
}

/// Reports the client's TLS handshake completion to async code.
final class HandshakeWatcher: Sendable {
    private let promise = Mutex<EventLoopPromise<Void>?>(nil)

    func handler(_ loop: any EventLoop) -> Handler {
        let p = loop.makePromise(of: Void.self)
        promise.withLock { $0 = p }
        return Handler(promise: p)
    }

    func completed() async throws {
        guard let p = promise.withLock({ $0 }) else { throw TimedOut() }
        try await p.futureResult.get()
    }

    final class Handler: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        let promise: EventLoopPromise<Void>
        var done = false
        init(promise: EventLoopPromise<Void>) { self.promise = promise }

        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if let event = event as? TLSUserEvent, case .handshakeCompleted = event, !done {
                done = true
                promise.succeed()
            }
            context.fireUserInboundEventTriggered(event)
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            if !done {
                done = true
                promise.fail(error)
            }
            context.fireErrorCaught(error)
        }

        func channelInactive(context: ChannelHandlerContext) {
            if !done {
                done = true
                promise.fail(DeviceTLSError.closedBeforeHandshake)
            }
            context.fireChannelInactive()
        }
    }
}
