import Foundation
import NIOCore
import NIOPosix
import NIOSSL
import PeerSync
@testable import PeerSyncSession
import PeerSyncTestSupport
@testable import PeerSyncWire
import Testing

/// Thousands of random and mutated frames thrown at live listeners (one behind TLS with the
/// right secret — a hostile member — and one in insecure mode), while an honest peer stays
/// connected. Afterwards the digests are unchanged and the honest peer still syncs.
@Suite("Hostile frames", .serialized)
struct HostileFramesTests {
    /// Opens a connection and writes `chunks` of bytes, then closes.
    static func send(_ chunks: [[UInt8]], to port: UInt16, tls: NIOSSLContext?) async throws {
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(.seconds(3))
            .connect(host: "127.0.0.1", port: Int(port)) { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let tls {
                        try channel.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: tls, serverHostname: nil))
                    }
                    return try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
                }
            }
        try? await channel.executeThenClose { _, outbound in
            for chunk in chunks {
                try await outbound.write(ByteBuffer(bytes: chunk))
            }
        }
    }

    static func hostileConnection(_ rng: inout SeededGenerator, victim: ReplicaID) -> (chunks: [[UInt8]], frames: Int) {
        let now = HybridLogicalClock.wallClock()
        let me = ReplicaID.random(using: &rng)
        let hello = Message.hello(Hello(replicaID: me, name: "mallory", wallClockMilliseconds: now,
                                        context: CausalContext(), digest: .empty)).encodedFrame()
        let dictionary = WireDictionary(startingAt: now)
        var map = RecordMap()
        let validDelta = try! map.write(["name": "evil"], to: RecordKey(collection: "locations", id: UUID()),
                                   at: HLCTimestamp(physicalMilliseconds: now, logical: 0), by: me)
        let deltaFrame = Message.delta(WireDelta.encode(validDelta, with: dictionary)).encodedFrame()
        var chunks: [[UInt8]] = []
        switch Int.random(in: 0..<8, using: &rng) {
        case 0:  // pure garbage
            chunks = [(0..<Int.random(in: 1...300, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }]
        case 1:  // hello, then frames of random types and bodies
            chunks = [hello] + (0..<20).map { _ in
                Frame.encode(type: UInt8.random(in: 0...20, using: &rng),
                             body: (0..<Int.random(in: 0...40, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) })
            }
        case 2:  // hello, then a truncated delta (counts are explicit, so never valid)
            var body = Array(deltaFrame.dropFirst(1))
            body.removeLast(Int.random(in: 1..<body.count, using: &rng))
            chunks = [hello, Frame.encode(type: body[0], body: Array(body.dropFirst()))]
        case 3:  // a length prefix far over the limit
            chunks = [hello, [0xff, 0xff, 0xff, 0x7f, 0x01]]
        case 4:  // a slow partial frame, then the connection drops
            chunks = [hello, Array(deltaFrame.prefix(deltaFrame.count / 2))]
        case 5:  // hellos that must be refused: other version, the victim's own ID, an hour ahead
            let bad = [
                Hello(protocolVersion: 99, replicaID: me, name: "old", wallClockMilliseconds: now, context: CausalContext(), digest: .empty),
                Hello(replicaID: victim, name: "impostor", wallClockMilliseconds: now, context: CausalContext(), digest: .empty),
                Hello(replicaID: me, name: "future", wallClockMilliseconds: now + 3_600_000, context: CausalContext(), digest: .empty),
            ].randomElement(using: &rng)!
            chunks = [Message.hello(bad).encodedFrame(), deltaFrame]
        case 6:  // a delta before any hello
            chunks = [deltaFrame]
        default:  // hello, then a delta frame with one byte of its header flipped into nonsense
            var corrupted = deltaFrame
            corrupted[1] = UInt8.random(in: 100...255, using: &rng)  // unknown message type
            chunks = [hello, corrupted]
        }
        return (chunks, chunks.count)
    }

    @Test("random and mutated frames change nothing, and honest peers keep syncing")
    func hostileFrames() async throws {
        let secret = GroupSecret.generate()
        let secure = try TestReplica("secure", security: .groupSecret(secret))
        let insecure = try TestReplica("insecure", security: .insecure)
        let honest = try TestReplica("honest", security: .groupSecret(secret))
        defer { Task { await secure.shutdown(); await insecure.shutdown(); await honest.shutdown() } }
        try await secure.write { try $0.save(Location(name: "before the attack")) }
        try await insecure.write { try $0.save(Location(name: "before the attack")) }
        try await secure.start()
        try await insecure.start()
        try await honest.start()
        await honest.node.addPeer(.loopback(secure.port))
        #expect(await eventually { allConverged([secure, honest]) })
        let digests = (secure.digest, insecure.digest)
        let tls = try TLSContexts(secret: secret).client

        var rng = SeededGenerator(seed: baseSeed)
        var frames = 0
        for i in 0..<800 {
            let target = i.isMultiple(of: 2) ? (secure, Optional(tls)) : (insecure, nil)
            let (chunks, count) = Self.hostileConnection(&rng, victim: target.0.store.replicaID)
            frames += count
            try await Self.send(chunks, to: target.0.port, tls: target.1)
        }
        #expect(frames > 2_000)
        #expect(secure.digest == digests.0)
        #expect(insecure.digest == digests.1)
        // The honest peer is still connected (or reconnects) and syncs both ways.
        let location = Location(name: "after the attack")
        try await honest.write { try $0.save(location) }
        #expect(await eventually { secure.store.state.contains(location.recordKey) })
        try await secure.write { try $0.save(Location(name: "reply")) }
        #expect(await eventually { allConverged([secure, honest]) })
        let peers = await secure.node.peers()
        #expect(peers.map(\.info.name) == ["honest"])
    }
}
