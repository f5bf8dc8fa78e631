import Foundation
import NIOCore
import NIOPosix
import NIOSSL
import PeerSync
@testable import PeerSyncReplication
@testable import PeerSyncNetwork
import PeerSyncTestSupport
import PeerSyncWire
import Testing

/// A hostile peer against a real `peersync run` process: garbage, huge lengths, slow partial
/// frames, replays of a recorded session, wrong secrets and versions. The node stays up, keeps
/// syncing with its honest peer, keeps its digest, and its memory stays bounded.
@Suite("Hostile peers", .ownThread, .serialized)
struct HostilePeerTests {
    static func residentKilobytes(_ pid: Int32) -> Int? {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }) else { return nil }
        return Int(line.split(separator: " ").dropFirst().first ?? "")
    }

    /// Writes `chunks` to `127.0.0.1:port` (through device TLS if given), slowly if asked. With
    /// `member`, it first completes a member's session handshake (hello, the victim's hello, auth),
    /// so what follows comes from an admitted device gone bad.
    static func connect(port: Int, tls: DeviceTLS?, chunks: [[UInt8]], pause: Duration = .zero,
                        member: LocalIdentity? = nil) async throws {
        let (channel, _) = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(.seconds(3))
            .connect(host: "127.0.0.1", port: port) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try SyncNode.configurePipeline(channel, tls: tls, dialed: true, maxFrame: WireLimits.defaultMaxFrameBytes)
                }
            }
        try? await channel.executeThenClose { inbound, outbound in
            if let member {
                let nonce = (0..<16).map { _ in UInt8.random(in: 0...255) }
                let me = ReplicaID.random()
                let hello = Hello(replicaID: me, name: "mallory", wallClockMilliseconds: HybridLogicalClock.wallClock(),
                                  context: CausalContext(), digest: .empty, groupID: member.groupID.bytes,
                                  deviceKey: member.key.publicKey.x963, nonce: nonce)
                try await outbound.write(ByteBuffer(bytes: Message.hello(hello).encodedFrame()))
                for try await frame in inbound.frames {
                    guard case .hello(let theirs) = try Message.decode(type: frame.type, body: frame.body) else { continue }
                    let signature = SessionAuth.sign(key: member.key, ownNonce: nonce, peerNonce: theirs.nonce ?? [], own: me,
                                                     group: member.groupID)
                    try await outbound.write(ByteBuffer(bytes: Message.auth(signature: signature).encodedFrame()))
                    break
                }
            }
            for chunk in chunks {
                try await outbound.write(ByteBuffer(bytes: chunk))
                if pause > .zero { try await Task.sleep(for: pause) }
            }
        }
    }

    @Test("a node under attack keeps its digest, its honest peer, and bounded memory")
    func attack() async throws {
        let stores = try Nodes.group(2, label: "peersync-hostile")
        defer { stores.forEach(removeTemporaryDirectory) }
        try Nodes.cli(stores[0], ["location", "add", "--name", "before the attack"])
        let victim = try Nodes.start(stores[0])
        defer { victim.kill(SIGTERM) }
        let address = try await Nodes.address(stores[0], pid: victim.pid)
        let port = Int(address.split(separator: ":").last!)!
        let honest = try Nodes.start(stores[1], peers: [address])
        defer { honest.kill(SIGTERM) }
        #expect(await eventually { Nodes.converged(stores) })
        let digest = try #require(Nodes.status(stores[0])?.digest)
        let memoryBefore = try #require(Self.residentKilobytes(victim.pid))

        // Mallory holds a member's device key (the honest node's): a member gone bad.
        let key = try DeviceKey.load(from: stores[1] + "/device-key.pem")
        let groupID = try #require(try ReplicaStore.open(directory: stores[1]).membership().flatMap { GroupID(bytes: $0.groupID) })
        let mallory = LocalIdentity(key: key, groupID: groupID)
        let member = try DeviceTLS(key: key) { _ in true }
        let stranger = try DeviceTLS(key: DeviceKey.generate()) { _ in true }
        var rng = SeededGenerator(seed: baseSeed)
        let now = HybridLogicalClock.wallClock()
        let nonce = (0..<16).map { _ in UInt8.random(in: 0...255, using: &rng) }
        func hello(version: UInt64 = WireLimits.protocolVersion, group: [UInt8] = groupID.bytes) -> [UInt8] {
            Message.hello(Hello(protocolVersion: version, replicaID: .random(using: &rng), name: "mallory",
                                wallClockMilliseconds: now, context: CausalContext(), digest: .empty, groupID: group,
                                deviceKey: key.publicKey.x963, nonce: nonce)).encodedFrame()
        }
        var attacks = 0
        for round in 0..<300 {
            switch round % 6 {
            case 0:  // garbage before TLS
                try await Self.connect(port: port, tls: nil, chunks: [(0..<512).map { _ in UInt8.random(in: 0...255, using: &rng) }])
            case 1:  // a member announcing a 4 GiB frame
                try await Self.connect(port: port, tls: member, chunks: [hello(), [0xff, 0xff, 0xff, 0xff, 0x0f]])
            case 2:  // a member trickling half a frame, byte by byte
                let frame = hello()
                try await Self.connect(port: port, tls: member, chunks: frame.prefix(frame.count / 2).map { [$0] }, pause: .milliseconds(1))
            case 3:  // another group's device
                try await Self.connect(port: port, tls: stranger, chunks: [hello(group: Array(repeating: 9, count: 16))])
            case 4:  // an old protocol version
                try await Self.connect(port: port, tls: member, chunks: [hello(version: 0)])
            default:  // a member's random frames after a valid, authenticated hello
                try await Self.connect(port: port, tls: member, chunks: (0..<10).map { _ in
                    Frame.encode(type: UInt8.random(in: 1...12, using: &rng),
                                 body: (0..<Int.random(in: 0...64, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) })
                }, member: mallory)
            }
            attacks += 1
        }
        let memoryAfter = try #require(Self.residentKilobytes(victim.pid))
        print("reliability: \(attacks) hostile connections; victim RSS \(memoryBefore) KiB → \(memoryAfter) KiB")
        #expect(memoryAfter - memoryBefore < 64 * 1024, "memory grew by \(memoryAfter - memoryBefore) KiB under attack")
        #expect(Nodes.status(stores[0])?.digest == digest)
        // Still alive, still syncing with the honest peer, both ways.
        try Nodes.cli(stores[1], ["location", "add", "--name", "after the attack"])
        #expect(await eventually { Nodes.status(stores[0])?.records["locations"] == 2 })
        #expect(await eventually { Nodes.converged(stores) })
        // Hostile sessions that got past a valid hello are closed; the status file (rewritten
        // every 0.5 s) then lists only the honest peer.
        #expect(await eventually { Nodes.status(stores[0])?.node?.peers.count == 1 })
    }

    @Test("bytes recorded from one session, replayed on a new connection, are refused by TLS")
    func replay() async throws {
        let stores = try Nodes.group(2, label: "peersync-replay")
        defer { stores.forEach(removeTemporaryDirectory) }
        let victim = try Nodes.start(stores[0])
        defer { victim.kill(SIGTERM) }
        let address = try await Nodes.address(stores[0], pid: victim.pid)
        let port = Int(address.split(separator: ":").last!)!
        // Record what an honest client sends (a recording proxy between it and the victim).
        let recorder = try await Recorder.start(forwardingTo: port)
        let honest = try Nodes.start(stores[1], peers: ["127.0.0.1:\(recorder.port)"])
        try Nodes.cli(stores[1], ["location", "add", "--name", "recorded delta"])
        #expect(await eventually { Nodes.converged(stores) })
        honest.kill(SIGTERM)
        // The status file is rewritten every 0.5 s: wait until it shows the honest peer gone.
        #expect(await eventually { Nodes.status(stores[0])?.node?.peers.isEmpty == true })
        let recorded = recorder.clientBytes()
        #expect(recorded.count > 200)
        let digest = try #require(Nodes.status(stores[0])?.digest)
        // Replay the whole client side, as is, twice.
        for _ in 0..<2 { try await Self.connect(port: port, tls: nil, chunks: [recorded]) }
        #expect(Nodes.status(stores[0])?.digest == digest)
        // No session came of it: after two more status refreshes, still no peer.
        let pid = try #require(Nodes.status(stores[0])?.node?.pid)
        var refreshes = 0
        var lastUpdate = ""
        _ = await eventually {
            let stamp = (try? String(contentsOfFile: stores[0] + "/node.json", encoding: .utf8)) ?? ""
            if stamp != lastUpdate { refreshes += 1; lastUpdate = stamp }
            return refreshes >= 3
        }
        #expect(Nodes.status(stores[0])?.node?.pid == pid)
        #expect(Nodes.status(stores[0])?.node?.peers.isEmpty == true)
        try await recorder.stop()
    }
}

/// A TCP proxy on 127.0.0.1 that forwards to `port` and keeps what the client sent.
final class Recorder: @unchecked Sendable {
    let port: Int
    private let server: any Channel
    private let lock = NSLock()
    private var recorded: [UInt8] = []

    private init(port: Int, server: any Channel) {
        self.port = port
        self.server = server
    }

    func clientBytes() -> [UInt8] { lock.withLock { recorded } }
    fileprivate func record(_ bytes: [UInt8]) { lock.withLock { recorded += bytes } }

    func stop() async throws { try await server.close() }

    static func start(forwardingTo target: Int) async throws -> Recorder {
        let box = RecorderBox()
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelInitializer { inbound in
                ClientBootstrap(group: inbound.eventLoop).connect(host: "127.0.0.1", port: target).flatMap { outbound in
                    inbound.pipeline.addHandler(Pump(to: outbound, recorder: box)).flatMap {
                        outbound.pipeline.addHandler(Pump(to: inbound, recorder: nil))
                    }
                }
            }
            .bind(host: "127.0.0.1", port: 0).get()
        let recorder = Recorder(port: server.localAddress!.port!, server: server)
        box.recorder = recorder
        return recorder
    }
}

final class RecorderBox: @unchecked Sendable {
    weak var recorder: Recorder?
}

/// Copies bytes from one channel to another (recording them if asked) and closes both together.
final class Pump: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = ByteBuffer
    let other: any Channel
    let recorder: RecorderBox?

    init(to other: any Channel, recorder: RecorderBox?) {
        self.other = other
        self.recorder = recorder
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        recorder?.recorder?.record(Array(buffer.readableBytesView))
        other.writeAndFlush(buffer, promise: nil)
    }

    func channelInactive(context: ChannelHandlerContext) {
        other.close(promise: nil)
    }
}
