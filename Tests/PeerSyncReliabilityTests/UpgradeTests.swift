import Foundation
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import PeerSync
@testable import PeerSyncReplication
@testable import PeerSyncNetwork
import PeerSyncTestSupport
import PeerSyncWire
import Synchronization
import Testing
import ShiftSchedulerModel

/// Stores made by the previous version (protocol 1, a shared group secret) move to device
/// identities without losing anything (issue 12, "Upgrade without data loss"). The fixtures in
/// Tests/Fixtures/protocol-1 were made by `peersync` at commit 576a906 (Tests/Fixtures/README.md).
@Suite("Upgrade from protocol 1", .ownThread, .serialized)
struct UpgradeTests {
    static let fixtures = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/protocol-1").path

    /// A copy of fixture store `name` ("office" or "laptop") in a temporary directory.
    func copy(_ name: String) throws -> String {
        let directory = try makeTemporaryDirectory("peersync-upgrade-\(name)")
        for file in try FileManager.default.contentsOfDirectory(atPath: "\(Self.fixtures)/\(name)") {
            try FileManager.default.copyItem(atPath: "\(Self.fixtures)/\(name)/\(file)", toPath: "\(directory)/\(file)")
        }
        try FileManager.default.setAttributes([.posixPermissions: 0o600], ofItemAtPath: "\(directory)/group-secret")
        return directory
    }

    struct Records: Equatable {
        var locations: [String]
        var shiftTypes: [String]
        var settings: [String: FieldValue]
    }

    func data(_ state: ReplicaState) throws -> Records {
        Records(locations: try state.fetchAll(Location.self).map { "\($0.id) \($0.name) \($0.address)" }.sorted(),
             shiftTypes: try state.fetchAll(ShiftType.self).map { "\($0.id) \($0.symbol) \($0.title) \($0.duration) \($0.locationID?.uuidString ?? "-")" }.sorted(),
             settings: state.settings(scope: .synced))
    }

    @Test("stores made by the previous version open with every record; after both upgrade and sync, their digests are equal")
    func upgrade() async throws {
        let (office, laptop) = (try copy("office"), try copy("laptop"))
        defer { [office, laptop].forEach(removeTemporaryDirectory) }
        // What the previous version had, read with the store alone (no upgrade yet).
        let before = (try data(ReplicaStore.open(directory: office).state), try data(ReplicaStore.open(directory: laptop).state))
        #expect(!before.0.locations.isEmpty && !before.1.shiftTypes.isEmpty)
        #expect(before.0 != before.1)  // the laptop made an edit the office never saw

        let lines = RecordingLogHandler.Lines()
        let a = try Replica(store: ReplicaStore.open(directory: office), directory: office,
                            logger: RecordingLogHandler.logger("office", into: lines, level: .info))
        let b = try Replica(store: ReplicaStore.open(directory: laptop), directory: laptop,
                            logger: RecordingLogHandler.logger("laptop", into: lines, level: .info))
        // Every record kept, as it was.
        #expect(try data(a.state) == before.0)
        #expect(try data(b.state) == before.1)
        // Both are admins of the group their old secret determines, without meeting anyone.
        let secret = try #require(a.legacySecret)
        #expect(a.groupID == LegacyGroupKey(groupSecret: secret.bytes).groupID && b.groupID == a.groupID)
        #expect(a.role == .admin && b.role == .admin)

        // A handshake timeout far beyond `eventually`'s 60 s: if either side held back its
        // enrolment, its sessions would wait in "joining" and the digests would never meet in
        // time. (A log-line check here failed on a loaded 2-core CI machine, where a session can
        // legitimately outlive a 10 s timeout before the peer's join is even read.)
        var timing = SyncTiming()
        timing.handshakeTimeout = .seconds(600)
        let port = try await a.startSync(SyncConfiguration(security: .tls, listen: .loopback(0), timing: timing))
        try await b.startSync(SyncConfiguration(security: .tls, listen: .loopback(0), peers: [.loopback(port)], timing: timing))
        #expect(await eventually { a.state.digest == b.state.digest })
        #expect(try data(a.state) == data(b.state))
        #expect(Set(try data(a.state).shiftTypes).isSuperset(of: before.0.shiftTypes + before.1.shiftTypes) || before.0.shiftTypes.isEmpty)
        #expect(a.roster().activeDevices.count == 2)
        // An admin closes the group to the old secret once everyone has upgraded.
        try await a.closeLegacyEnrolment()
        #expect(await eventually { b.roster().isLegacyEnrolmentClosed })
        await a.stopSync()
        await b.stopSync()
    }

    /// Sends `frames` over TLS 1.2 with the old group secret (as a protocol-1 node would) and
    /// returns the messages that came back until the connection closed.
    func asProtocol1Node(port: UInt16, secret: GroupSecret, frames: [[UInt8]]) async throws -> [Message] {
        let tls = try TLSContexts(secret: secret)
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(.seconds(3))
            .connect(host: "127.0.0.1", port: Int(port)) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: tls.client, serverHostname: nil))
                    try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(FrameDecoder(maxFrameBytes: 4 << 20)))
                    return try NIOAsyncChannel<InboundFrame, ByteBuffer>(wrappingChannelSynchronously: channel)
                }
            }
        var received: [Message] = []
        try await channel.executeThenClose { inbound, outbound in
            for frame in frames { try await outbound.write(ByteBuffer(bytes: frame)) }
            for try await frame in inbound { received.append(try Message.decode(type: frame.type, body: frame.body)) }
        }
        return received
    }

    @Test("a node of the previous version that dials an upgraded one is told to upgrade, and nothing crosses")
    func oldNodeHearsUpgrade() async throws {
        let office = try copy("office")
        defer { removeTemporaryDirectory(office) }
        let a = try Replica(store: ReplicaStore.open(directory: office), directory: office, logger: Logger(label: "office"))
        let port = try await a.startSync(SyncConfiguration(security: .tls, listen: .loopback(0)))
        let digest = a.state.digest
        // What a protocol-1 node sends first: its hello (no group, key or nonce; those came with 2).
        let hello = Hello(protocolVersion: 1, replicaID: .random(), name: "old laptop", wallClockMilliseconds: HybridLogicalClock.wallClock(),
                          context: CausalContext(), digest: .empty)
        let received = try await asProtocol1Node(port: port, secret: try #require(a.legacySecret), frames: [Message.hello(hello).encodedFrame()])
        let refusal = received.compactMap { message -> String? in
            if case .error(.protocolVersion, let text) = message { return text }
            return nil
        }.first
        #expect(refusal?.contains("upgrade") == true, "\(received)")
        #expect(!received.contains { if case .chunk = $0 { true } else { false } })  // no data
        #expect(a.state.digest == digest)
        await a.stopSync()
    }

    @Test("an upgraded node dialing a node of the previous version falls back to the old TLS and tells it to upgrade")
    func upgradedNodeReachesOldNode() async throws {
        let office = try copy("office")
        defer { removeTemporaryDirectory(office) }
        let lines = RecordingLogHandler.Lines()
        let a = try Replica(store: ReplicaStore.open(directory: office), directory: office,
                            logger: RecordingLogHandler.logger("office", into: lines))
        let secret = try #require(a.legacySecret)
        // A stand-in for a protocol-1 listener: TLS 1.2 with the group's pre-shared key; it reads
        // the first frame and answers as that version does to another version.
        let tls = try TLSContexts(secret: secret)
        let heard = Mutex<[Message]>([])
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .bind(host: "127.0.0.1", port: 0) { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: tls.server))
                    try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(FrameDecoder(maxFrameBytes: 4 << 20)))
                    return try NIOAsyncChannel<InboundFrame, ByteBuffer>(wrappingChannelSynchronously: channel)
                }
            }
        let serverTask = Task {
            try await server.executeThenClose { connections in
                for try await connection in connections {
                    try? await connection.executeThenClose { inbound, outbound in
                        for try await frame in inbound {
                            let message = try Message.decode(type: frame.type, body: frame.body)
                            heard.withLock { $0.append(message) }
                            if case .hello(let hello) = message {
                                let text = "peer speaks protocol version \(hello.protocolVersion), this node 1; upgrade the older one"
                                try await outbound.write(ByteBuffer(bytes: Message.error(.protocolVersion, text).encodedFrame()))
                                return
                            }
                        }
                    }
                }
            }
        }
        defer { serverTask.cancel() }
        let port = UInt16(try #require(server.channel.localAddress?.port))
        try await a.startSync(SyncConfiguration(security: .tls, listen: nil, peers: [.loopback(port)]))
        #expect(await eventually { heard.withLock { $0.contains { if case .hello(let h) = $0 { h.protocolVersion == 2 } else { false } } } })
        #expect(await eventually { lines.all.contains { $0.contains("upgrade the older one") } })
        await a.stopSync()
        try? await server.channel.close()
        // Not cancelled: the loop ends when the listener closes, after consuming every
        // connection already accepted (NIO traps on one dropped unconsumed).
        _ = await serverTask.result
    }
}
