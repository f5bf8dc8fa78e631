import Foundation
import NIOCore
import NIOPosix
import NIOSSL
import PeerSync
@testable import PeerSyncReplication
@testable import PeerSyncNetwork
import PeerSyncTestSupport
@testable import PeerSyncWire
import Testing
import ShiftSchedulerModel

/// Thousands of random and mutated frames thrown at live listeners (one behind TLS with the
/// right secret — a hostile member — and one in insecure mode), while an honest peer stays
/// connected. Afterwards the digests are unchanged and the honest peer still syncs.
@Suite("Hostile frames", .serialized, .awaitsCleanups)
struct HostileFramesTests {
    /// Opens a connection as `identity` and writes `chunks`, then closes. With `authenticate`,
    /// it first completes the session handshake (hello, the victim's hello, auth), so the chunks
    /// come from an admitted member — the hostile member of the threat model.
    static func send(_ chunks: [[UInt8]], to port: UInt16, tls: DeviceTLS?, as identity: LocalIdentity, authenticate: Bool) async throws {
        let (channel, _) = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(.seconds(3))
            .connect(host: "127.0.0.1", port: Int(port)) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try SyncNode.configurePipeline(channel, tls: tls, dialed: true, maxFrame: WireLimits.defaultMaxFrameBytes)
                }
            }
        try? await channel.executeThenClose { inbound, outbound in
            if authenticate {
                let nonce = (0..<16).map { _ in UInt8.random(in: 0...255) }
                let me = ReplicaID.random()
                let hello = Hello(replicaID: me, name: "mallory", wallClockMilliseconds: HybridLogicalClock.wallClock(),
                                  context: CausalContext(), digest: .empty, groupID: identity.groupID.bytes,
                                  deviceKey: identity.key.publicKey.x963, nonce: nonce)
                try await outbound.write(ByteBuffer(bytes: Message.hello(hello).encodedFrame()))
                for try await frame in inbound.frames {
                    guard case .hello(let theirs) = try Message.decode(type: frame.type, body: frame.body) else { continue }
                    let signature = SessionAuth.sign(key: identity.key, ownNonce: nonce, peerNonce: theirs.nonce ?? [], own: me,
                                                     group: identity.groupID)
                    try await outbound.write(ByteBuffer(bytes: Message.auth(signature: signature).encodedFrame()))
                    break
                }
            }
            for chunk in chunks {
                try await outbound.write(ByteBuffer(bytes: chunk))
            }
        }
    }

    /// Hostile bytes for one connection, and whether they follow an authenticated handshake (a
    /// member gone bad) or come from anyone (before or instead of a valid hello).
    static func hostileConnection(_ rng: inout SeededGenerator, victim: ReplicaID, group: GroupID)
        -> (chunks: [[UInt8]], frames: Int, authenticated: Bool)
    {
        let now = HybridLogicalClock.wallClock()
        let me = ReplicaID.random(using: &rng)
        let nonce = (0..<16).map { _ in UInt8.random(in: 0...255, using: &rng) }
        let stranger = DeviceKey.generate()
        func hello(_ replica: ReplicaID, version: UInt64 = WireLimits.protocolVersion, at clock: UInt64 = now) -> Hello {
            Hello(protocolVersion: version, replicaID: replica, name: "mallory", wallClockMilliseconds: clock, context: CausalContext(),
                  digest: .empty, groupID: group.bytes, deviceKey: stranger.publicKey.x963, nonce: nonce)
        }
        let dictionary = WireDictionary(startingAt: now)
        var map = RecordMap()
        let validDelta = try! map.write(["name": "evil"], to: RecordKey(collection: "locations", id: UUID()),
                                   at: HLCTimestamp(physicalMilliseconds: now, logical: 0), by: me)
        let deltaFrame = Message.delta(WireDelta.encode(validDelta, with: dictionary)).encodedFrame()
        var chunks: [[UInt8]] = []
        var authenticated = false
        switch Int.random(in: 0..<8, using: &rng) {
        case 0:  // pure garbage
            chunks = [(0..<Int.random(in: 1...300, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }]
        case 1:  // (as a member) frames of random types and bodies
            authenticated = true
            chunks = (0..<20).map { _ in
                Frame.encode(type: UInt8.random(in: 0...20, using: &rng),
                             body: (0..<Int.random(in: 0...40, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) })
            }
        case 2:  // (as a member) a truncated delta (counts are explicit, so never valid)
            authenticated = true
            var body = Array(deltaFrame.dropFirst(1))
            body.removeLast(Int.random(in: 1..<body.count, using: &rng))
            chunks = [Frame.encode(type: body[0], body: Array(body.dropFirst()))]
        case 3:  // (as a member) a length prefix far over the limit
            authenticated = true
            chunks = [[0xff, 0xff, 0xff, 0x7f, 0x01]]
        case 4:  // (as a member) a slow partial frame, then the connection drops
            authenticated = true
            chunks = [Array(deltaFrame.prefix(deltaFrame.count / 2))]
        case 5:  // hellos that must be refused: other version, the victim's own ID, an hour ahead, a
                 // stranger's device (unauthenticated: its data must not land), another group
            let bad = [hello(me, version: 99), hello(victim), hello(me, at: now + 3_600_000), hello(me),
                       Hello(replicaID: me, name: "other group", wallClockMilliseconds: now, context: CausalContext(), digest: .empty,
                             groupID: Array(repeating: 7, count: 16), deviceKey: stranger.publicKey.x963, nonce: nonce)]
                .randomElement(using: &rng)!
            chunks = [Message.hello(bad).encodedFrame(), deltaFrame]
        case 6:  // a delta before any hello
            chunks = [deltaFrame]
        default:  // (as a member) a delta frame with one byte of its header flipped into nonsense
            authenticated = true
            var corrupted = deltaFrame
            corrupted[1] = UInt8.random(in: 100...255, using: &rng)  // unknown message type
            chunks = [corrupted]
        }
        return (chunks, chunks.count, authenticated)
    }

    @Test("random and mutated frames change nothing, and honest peers keep syncing")
    func hostileFrames() async throws {
        let group = TestGroup()
        let secure = try TestReplica("secure", in: group)
        let insecure = try TestReplica("insecure", in: group, security: .insecure)
        let honest = try TestReplica("honest", in: group)
        defer { afterTest { await secure.shutdown(); await insecure.shutdown(); await honest.shutdown() } }
        try await secure.write { try $0.save(Location(name: "before the attack")) }
        try await insecure.write { try $0.save(Location(name: "before the attack")) }
        try await secure.start()
        try await insecure.start()
        try await honest.start()
        await honest.node.addPeer(.loopback(secure.port))
        #expect(await eventually { allConverged([secure, honest]) })
        let digests = (secure.digest, insecure.digest)
        // Mallory is a member of the group (a device of the roster) gone bad.
        let mallory = try TestReplica("mallory", in: group)  // its key only: its node never starts
        defer { afterTest { await mallory.shutdown() } }
        let tls = try DeviceTLS(key: mallory.identity.key) { _ in true }

        var rng = SeededGenerator(seed: baseSeed)
        var frames = 0
        for i in 0..<800 {
            let target = i.isMultiple(of: 2) ? (secure, Optional(tls)) : (insecure, nil)
            let (chunks, count, authenticated) = Self.hostileConnection(&rng, victim: target.0.store.replicaID,
                                                                        group: group.devices.groupID)
            frames += count
            try await Self.send(chunks, to: target.0.port, tls: target.1, as: mallory.identity, authenticate: authenticated)
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

    /// Connects (over TLS as `tls` says), writes `hello` at once, and returns every frame the
    /// node sends until it closes the connection (bounded: the node closes after its error).
    static func answers(to hello: Hello, port: UInt16, tls: DeviceTLS?) async throws -> [Message] {
        let (channel, _) = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(.seconds(3))
            .connect(host: "127.0.0.1", port: Int(port)) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try SyncNode.configurePipeline(channel, tls: tls, dialed: true, maxFrame: WireLimits.defaultMaxFrameBytes)
                }
            }
        return try await channel.executeThenClose { inbound, outbound -> [Message] in
            try await outbound.write(ByteBuffer(bytes: Message.hello(hello).encodedFrame()))
            var messages: [Message] = []
            do {
                for try await frame in inbound.frames {
                    messages.append(try Message.decode(type: frame.type, body: frame.body))
                    if messages.count >= 10 { break }
                }
            } catch {
                // The node closed the connection after its error frame (TLS may report it so).
            }
            return messages
        }
    }

    @Test("a wrong-group or version-1 hello is answered with the node's own hello first, then the error, over plain TCP as over TLS (§5.1)")
    func helloBeforeError() async throws {
        let group = TestGroup()
        let insecure = try TestReplica("insecure", in: group, security: .insecure)
        let secure = try TestReplica("secure", in: group)
        defer { afterTest { await insecure.shutdown(); await secure.shutdown() } }
        try await insecure.start()
        try await secure.start()
        let stranger = DeviceKey.generate()
        let tls = try DeviceTLS(key: stranger) { _ in true }
        func hello(version: UInt64 = WireLimits.protocolVersion, group: [UInt8]) -> Hello {
            Hello(protocolVersion: version, replicaID: .random(), name: "stranger", wallClockMilliseconds: HybridLogicalClock.wallClock(),
                  context: CausalContext(), digest: .empty, groupID: group, deviceKey: stranger.publicKey.x963,
                  nonce: [UInt8](repeating: 1, count: 16))
        }
        let cases: [(Hello, CloseReason)] = [
            (hello(group: [UInt8](repeating: 7, count: 16)), .notAdmitted),
            (hello(version: 1, group: group.devices.groupID.bytes), .protocolVersion),
        ]
        for node in [insecure, secure] {
            for (theirs, reason) in cases {
                // Several connections each: the node reading the hello before its writer ran is a race.
                for _ in 0..<5 {
                    let messages = try await Self.answers(to: theirs, port: node.port, tls: node.security == .tls ? tls : nil)
                    guard case .hello(let ours)? = messages.first, case .error(let sent, _)? = messages.last, messages.count == 2 else {
                        Issue.record("\(node.name), \(reason): \(messages)")
                        continue
                    }
                    #expect(ours.replicaID == node.store.replicaID)
                    #expect(sent == reason)
                }
            }
        }
    }
}
