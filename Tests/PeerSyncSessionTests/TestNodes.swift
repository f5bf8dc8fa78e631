import Foundation
import Logging
import PeerSync
import PeerSyncTestSupport
import Synchronization

/// Devices of one group for a suite: each new ``TestReplica`` takes the next one.
final class TestGroup: Sendable {
    let devices: LocalGroup
    private let next = Mutex(0)

    init(size: Int = 24) {
        devices = try! LocalGroup.make(names: (0..<size).map { "device\($0)" })
    }

    func take() -> Int {
        next.withLock { n in
            defer { n += 1 }
            precondition(n < devices.keys.count, "the test group has no device left")
            return n
        }
    }
}

/// A replica with a real SQLite store in a temporary folder and a real node on 127.0.0.1, as a
/// device of `group`.
final class TestReplica: @unchecked Sendable {
    let directory: String
    let store: ReplicaStore
    var node: SyncNode
    var port: UInt16 = 0
    let name: String
    let security: SessionSecurity
    let identity: LocalIdentity
    let wallClock: @Sendable () -> UInt64

    init(_ name: String, in group: TestGroup, security: SessionSecurity = .tls, directory: String? = nil,
         wallClock: @escaping @Sendable () -> UInt64 = HybridLogicalClock.wallClock) throws {
        self.name = name
        self.security = security
        self.wallClock = wallClock
        let member = group.take()
        identity = group.devices.identity(member)
        if let directory {
            self.directory = directory
            store = try ReplicaStore.open(directory: directory)
        } else {
            self.directory = try makeTemporaryDirectory("peersync-node")
            store = try ReplicaStore.create(directory: self.directory, name: name, physicalClock: wallClock)
        }
        try group.devices.install(into: store, member: member)
        node = try Self.makeNode(store: store, name: name, identity: identity, security: security, wallClock: wallClock)
    }

    static func makeNode(store: ReplicaStore, name: String, identity: LocalIdentity, security: SessionSecurity,
                         wallClock: @escaping @Sendable () -> UInt64) throws -> SyncNode {
        var logger = Logger(label: "test.\(name)")
        logger.logLevel = ProcessInfo.processInfo.environment["PEERSYNC_TEST_LOG"] == nil ? .critical : .debug
        // A handshake on a loaded 2-core CI machine has outlived the 10 s default; tests of the
        // timeout itself set their own timing (NodeLimitsTests).
        var timing = SyncTiming()
        timing.handshakeTimeout = .seconds(60)
        return try SyncNode(
            storage: StoreSyncStorage(store), replicaID: store.replicaID, name: name, identity: identity,
            configuration: SyncConfiguration(security: security, listen: .loopback(0), timing: timing, wallClock: wallClock),
            logger: logger)
    }

    @discardableResult
    func start() async throws -> UInt16 {
        port = try await node.start()
        return port
    }

    /// A local edit: committed (the node ships it: it follows the store's commit feed).
    func write(_ body: (inout ReplicaState) throws -> RecordMap?) async throws {
        try store.write(body)
    }

    var digest: StateDigest { store.state.digest }

    /// Stops the node and starts a new one on the same store (as after a restart).
    func restartNode() async throws {
        await node.stop()
        node = try Self.makeNode(store: store, name: name, identity: identity, security: security, wallClock: wallClock)
    }

    func shutdown() async {
        await node.stop()
        removeTemporaryDirectory(directory)
    }
}

func allConverged(_ replicas: [TestReplica]) -> Bool {
    Set(replicas.map(\.digest)).count == 1
}
