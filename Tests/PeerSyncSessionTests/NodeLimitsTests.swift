import Foundation
import Logging
import NIOCore
import NIOPosix
@testable import PeerSync
@testable import PeerSyncReplication
@testable import PeerSyncNetwork
import PeerSyncTestSupport
import Testing
import ShiftSchedulerModel

/// A TCP connection from a loopback address of our choice (127.0.0.2, 127.0.0.3, … all reach
/// the node on 127.0.0.1) that only counts what it receives; with `tls`, it sends a ClientHello.
struct RawClient {
    let channel: any Channel
    let counter: ByteCounter

    static func connect(from source: String, to port: UInt16, tls: DeviceTLS? = nil) async throws -> RawClient {
        let counter = ByteCounter()
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .bind(to: try SocketAddress(ipAddress: source, port: 0))
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(counter)
                    if let tls { _ = try tls.configure(channel, dialed: true) }
                }
            }
            .connect(host: "127.0.0.1", port: Int(port)).get()
        return RawClient(channel: channel, counter: counter)
    }

    var isOpen: Bool { channel.isActive }

    func close() async { try? await channel.close() }
}

/// A listener on `host` that accepts connections and never sends a byte: what a forged advert
/// can point at (the TLS handshake of a node dialing it times out).
final class BlackHole: Sendable {
    let channel: any Channel
    var port: UInt16 { UInt16(channel.localAddress!.port!) }

    init(host: String) async throws {
        channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .bind(host: host, port: 0).get()
    }

    func close() async { try? await channel.close() }
}

/// The limits of ``SyncLimits`` enforced by real nodes on 127.0.0.x with TLS.
@Suite("Limits on real sockets", .serialized, .awaitsCleanups)
struct NodeLimitsTests {
    let group = TestGroup()

    /// Replaces `replica`'s node by one with these limits and timing.
    static func limit(_ replica: TestReplica, _ limits: SyncLimits, timing: SyncTiming = SyncTiming(),
                      security: SessionSecurity = .tls, logger: Logger? = nil) throws {
        replica.node = try SyncNode(
            storage: StoreSyncStorage(replica.store), replicaID: replica.store.replicaID, name: replica.name,
            identity: replica.identity,
            configuration: SyncConfiguration(security: security, listen: .loopback(0), timing: timing, limits: limits),
            logger: logger ?? Logger(label: "test.\(replica.name)") { _ in SwiftLogNoOpLogHandler() })
    }

    @Test("connections over the per-address or the total limit are closed on arrival, before any TLS byte; one log line; a peer still syncs")
    func inboundLimits() async throws {
        let victim = try TestReplica("victim", in: group)
        let honest = try TestReplica("honest", in: group)
        defer { afterTest { await victim.shutdown(); await honest.shutdown() } }
        var limits = SyncLimits()
        limits.inboundConnections = 4
        limits.inboundConnectionsPerAddress = 2
        var timing = SyncTiming()
        timing.handshakeTimeout = .seconds(60)  // idle connections stay for the test
        let lines = RecordingLogHandler.Lines()
        try Self.limit(victim, limits, timing: timing, logger: RecordingLogHandler.logger("victim", into: lines, level: .info))
        let port = try await victim.start()
        let stranger = try DeviceTLS(key: DeviceKey.generate()) { _ in true }

        // Two idle connections from 127.0.0.2 are taken; a third, which sends a ClientHello, is
        // closed at once without a byte in answer.
        let held = [try await RawClient.connect(from: "127.0.0.2", to: port), try await RawClient.connect(from: "127.0.0.2", to: port)]
        #expect(await eventually { await victim.node.limitStatus().inboundOpen == 2 })
        let firstRefusal = ContinuousClock.now
        let refused = try await RawClient.connect(from: "127.0.0.2", to: port, tls: stranger)
        #expect(await eventually(timeout: .seconds(30)) { !refused.isOpen }, "a connection over the per-address limit stayed open")
        #expect(refused.counter.read == 0, "the node answered a refused connection (TLS work)")
        #expect(refused.counter.written > 0, "the refused client did send its ClientHello")
        // Another address is admitted, and answered.
        let answered = try await RawClient.connect(from: "127.0.0.3", to: port, tls: stranger)
        #expect(await eventually { answered.counter.read > 0 })
        // The fourth fills the total; a fifth, from a fresh address, is over it.
        let fourth = try await RawClient.connect(from: "127.0.0.4", to: port)
        #expect(await eventually { await victim.node.limitStatus().inboundOpen == 4 })
        let overTotal = try await RawClient.connect(from: "127.0.0.5", to: port)
        #expect(await eventually(timeout: .seconds(30)) { !overTotal.isOpen })
        let refusalsSpan = ContinuousClock.now - firstRefusal
        let status = await victim.node.limitStatus()
        #expect((status.refusedOverAddress, status.refusedOverTotal, status.inboundOpen) == (1, 1, 4))
        #expect(held.allSatisfy(\.isOpen) && answered.isOpen && fourth.isOpen, "an admitted connection was closed")
        // Two refusals within 10 s: one warning line (two if a loaded machine spread them wider).
        let warnings = lines.all.filter { $0.contains("inbound connections refused") }
        #expect(warnings.count == 1 || (warnings.count == 2 && refusalsSpan > .seconds(10)), "\(warnings)")
        #expect(warnings.first?.contains("refused.overAddress=1") == true)

        // Room again once connections close: the honest peer (from 127.0.0.1) connects and syncs.
        for client in held + [fourth] { await client.close() }
        #expect(await eventually { await victim.node.limitStatus().inboundOpen == 1 })
        try await honest.start()
        await honest.node.addPeer(.loopback(port))
        try await honest.write { try $0.save(Location(name: "after the flood")) }
        #expect(await eventually { allConverged([victim, honest]) })
        await answered.close()
    }

    @Test("a connection that does not finish its handshake in time is closed (TLS and insecure)", arguments: [true, false])
    func handshakeTimeout(tls: Bool) async throws {
        let victim = try TestReplica("victim", in: group, security: tls ? .tls : .insecure)
        defer { afterTest { await victim.shutdown() } }
        var timing = SyncTiming()
        timing.handshakeTimeout = .milliseconds(500)
        try Self.limit(victim, SyncLimits(), timing: timing, security: tls ? .tls : .insecure)
        let port = try await victim.start()
        let started = ContinuousClock.now
        let idle = try await RawClient.connect(from: "127.0.0.2", to: port)
        #expect(await eventually(timeout: .seconds(30)) { !idle.isOpen }, "an idle connection outlived the handshake timeout")
        let elapsed = ContinuousClock.now - started
        #expect(elapsed >= .milliseconds(400), "closed before the timeout: \(elapsed)")
        #expect(await eventually { await victim.node.limitStatus().inboundOpen == 0 })
    }

    @Test("forged discovered addresses that never answer take at most N attempts at once; a real peer is still dialed and synced")
    func forgedAddresses() async throws {
        let node = try TestReplica("node", in: group)
        let real = try TestReplica("real", in: group)
        defer { afterTest { await node.shutdown(); await real.shutdown() } }
        var limits = SyncLimits()
        limits.concurrentDials = 2
        var timing = SyncTiming()
        timing.handshakeTimeout = .seconds(1)
        try Self.limit(node, limits, timing: timing)
        try await node.start()
        try await real.start()
        // Forged adverts first: 12 black holes on two hosts (127.0.0.2 and 127.0.0.3).
        var holes: [BlackHole] = []
        for i in 0..<12 { holes.append(try await BlackHole(host: i < 6 ? "127.0.0.2" : "127.0.0.3")) }
        defer { let all = holes; afterTest { for hole in all { await hole.close() } } }
        for (i, hole) in holes.enumerated() {
            await node.node.discovered(PeerAddress(host: i < 6 ? "127.0.0.2" : "127.0.0.3", port: hole.port), serviceName: "forged \(i)")
        }
        let started = ContinuousClock.now
        await node.node.discovered(.loopback(real.port), serviceName: "real")
        // How many attempts had started when the real peer was dialed — seen as the real peer's
        // first inbound connection, not the finished handshake, which on a loaded 2-core machine
        // took seconds while forged attempts went on (15 on CI). Not how long it took either.
        // Dialed last, it would have waited for all 12 forged ones.
        var attemptsWhenConnected = Int.max
        #expect(await eventually(every: .milliseconds(5)) {
            let accepted = await real.node.limitStatus().inboundOpen > 0
            let connected = !(await node.node.peers().isEmpty)
            guard accepted || connected else { return false }
            attemptsWhenConnected = await node.node.limitStatus().dialAttempts
            return true
        })
        #expect(await eventually { !(await node.node.peers().isEmpty) })
        let connectedAfter = ContinuousClock.now - started
        try await real.write { try $0.save(Location(name: "found despite the forgeries")) }
        #expect(await eventually { allConverged([node, real]) })
        // Until 4 forged addresses have been refused: never more than 2 attempts at once.
        var samples: [LimitStatus] = []
        #expect(await eventually(timeout: .seconds(60), every: .milliseconds(50)) {
            samples.append(await node.node.limitStatus())
            return samples.last!.rejectedTargets >= 4
        }, "forged addresses were not backed off: \(String(describing: samples.last))")
        let last = try #require(samples.last)
        print("limits: real peer connected \(connectedAfter) after 12 forged adverts, as attempt \(attemptsWhenConnected) or earlier; "
            + "attempts \(last.dialAttempts), peak \(last.dialingPeak)")
        #expect(samples.allSatisfy { $0.dialing <= 2 })
        #expect(last.dialingPeak == 2)
        #expect(last.dialTargets == 13)
        // 4 refusals take about 4 attempts on 2 hosts, one at a time each; the 5 s backoff keeps
        // the refused ones out meanwhile.
        #expect(last.dialAttempts <= 16, "too many attempts: \(last.dialAttempts)")
        #expect(attemptsWhenConnected <= 8, "the real peer waited behind \(attemptsWhenConnected) attempts")
    }

    @Test("syncHealth and healthUpdates report refused connections and the watchdog's repairs")
    func replicaHealth() async throws {
        let directory = try makeTemporaryDirectory("peersync-health")
        defer { removeTemporaryDirectory(directory) }
        let replica = try Replica.open(at: directory, name: "health")
        var limits = SyncLimits()
        limits.inboundConnectionsPerAddress = 1
        let port = try await replica.startSync(SyncConfiguration(security: .tls, listen: .loopback(0), limits: limits))
        var updates = replica.healthUpdates().makeAsyncIterator()
        #expect(await updates.next() == SyncHealth())
        let held = try await RawClient.connect(from: "127.0.0.2", to: port)
        let refused = try await RawClient.connect(from: "127.0.0.2", to: port)
        let update = await updates.next()
        #expect(update?.limits.refusedOverAddress == 1)
        #expect(await eventually { !refused.isOpen })
        #expect(await replica.syncHealth().limits.inboundOpen == 1)
        // The watchdog's event (its counting is ReplicationCoreTests') reaches the health.
        let info = PeerInfo(replicaID: .random(), name: "peer", address: "127.0.0.9:1", dialed: false)
        await replica.currentNode?.replicator.emit(.divergenceRepaired(info, repairs: 1))
        let repaired = await updates.next()
        #expect(repaired?.repairs == 1)
        #expect(await replica.syncHealth().repairs == 1)
        await held.close()
        await replica.stopSync()
    }
}
