import Foundation
import Logging
import PeerSyncCRDT
import PeerSyncDiscovery
import PeerSyncModel
import PeerSyncSession
import PeerSyncStore
import PeerSyncWire
import Synchronization

/// A change to a replica's records, wherever it came from.
public struct ReplicaChange: Sendable {
    public enum Origin: Sendable, Equatable {
        /// Made through this `Replica`.
        case local
        /// Received from a peer.
        case peer(name: String, replicaID: ReplicaID)
        /// Committed by another process on the same store (e.g. the `peersync` command).
        case otherProcess
    }

    public let origin: Origin
    /// The records that changed (empty when another process rewrote so much that the replica
    /// reloaded: re-read everything).
    public let records: Set<RecordKey>
}

/// Where sync stands, for a status line in an app.
public enum SyncStatus: Sendable, Equatable {
    /// Sync is off: the replica works locally only.
    case disabled
    /// Sync is on, no peer connected yet (or all went away).
    case connecting
    /// Exchanging data; `progress` is the catch-up fraction when known.
    case syncing(progress: Double?)
    /// Every connected peer holds the same state as this replica.
    case inSync(lastSync: Date, peers: [String])
    /// Something a person can fix (wrong secret, clock skew, port in use…).
    case error(String)
}

/// How to sync.
public struct SyncConfiguration: Sendable {
    public var security: SessionSecurity
    public var listenHost: String
    /// 0 picks a free port.
    public var listenPort: Int
    /// Static peers (`host`, `port`), for networks without multicast.
    public var peers: [(host: String, port: Int)]
    public var maxClockSkew: Duration
    /// Advertise and find peers of the group on the LAN with DNS-SD (avahi on Linux).
    public var discovery: Bool
    /// `.deltas` normally; `.fullState` only to compare against classic state-based sync.
    public var transfer: SyncNode.Configuration.Transfer = .deltas

    public init(security: SessionSecurity, listenHost: String = "0.0.0.0", listenPort: Int = 0,
                peers: [(host: String, port: Int)] = [], maxClockSkew: Duration = .seconds(300), discovery: Bool = false) {
        self.security = security
        self.listenHost = listenHost
        self.listenPort = listenPort
        self.peers = peers
        self.maxClockSkew = maxClockSkew
        self.discovery = discovery
    }

    /// The opaque DNS-SD tag of this configuration's group.
    var groupTag: String {
        if case .groupSecret(let secret) = security { return secret.groupTag }
        return "insecure"
    }
}

/// An offline-first replica an app opens at a path: typed reads and writes that work with sync
/// off, and sync that can be turned on and off at any time.
///
/// ```swift
/// let replica = try Replica.open(at: documentsPath + "/peersync", name: "Anna's iPad")
/// try await replica.save(Location(name: "Ward 3"))
/// for await change in replica.changes() { refreshUI(change.records) }
/// try await replica.startSync(SyncConfiguration(security: .groupSecret(secret)))
/// ```
public actor Replica {
    public nonisolated let store: ReplicaStore
    public nonisolated let directory: String
    nonisolated let logger: Logger
    private var node: SyncNode?
    private var discovery: PeerDiscovery?
    private var dialedDiscovered: [ReplicaID: String] = [:]
    private var tasks: [Task<Void, Never>] = []
    private var status = SyncStatus.disabled
    private var peerNames: [ReplicaID: String] = [:]
    private nonisolated let changeSubscribers = Broadcaster<ReplicaChange>()
    private nonisolated let statusSubscribers = Broadcaster<SyncStatus>()
    /// Live observations, peer names and attachments (Replica+Observation.swift and neighbours).
    nonisolated let appSupport = AppSupport()

    /// Opens the replica at `directory`, creating it (named `name`, default the host name) if
    /// there is none. Fast, never touches the network.
    public static func open(at directory: String, name: String? = nil, logger: Logger = Logger(label: "peersync")) throws -> Replica {
        let exists = FileManager.default.fileExists(atPath: ReplicaStore.path(in: directory))
        let store = exists ? try ReplicaStore.open(directory: directory)
            : try ReplicaStore.create(directory: directory, name: name ?? ProcessInfo.processInfo.hostName)
        return Replica(store: store, directory: directory, logger: logger)
    }

    /// A replica over an open store.
    public init(store: ReplicaStore, directory: String, logger: Logger) {
        self.store = store
        self.directory = directory
        self.logger = logger
    }

    public nonisolated var replicaID: ReplicaID { store.replicaID }
    /// The current state (a snapshot; cheap).
    public nonisolated var state: ReplicaState { store.state }

    // MARK: - Reading

    public nonisolated func fetch<R: SyncRecord>(_ type: R.Type, id: UUID) throws -> R? {
        try store.state.fetch(type, id: id)
    }

    public nonisolated func fetchAll<R: SyncRecord>(_ type: R.Type) throws -> [R] {
        try store.state.fetchAll(type)
    }

    public nonisolated func setting(_ key: String, scope: SettingScope) -> FieldValue? {
        store.state.setting(key, scope: scope)
    }

    // MARK: - Writing

    /// Saves `record` (creating or updating it; only changed fields are written). Returns once
    /// committed to disk; peers receive it at once if sync is on.
    public func save<R: SyncRecord>(_ record: R) async throws {
        try await commit { try $0.save(record) }
    }

    /// Deletes a record. Returns false if there was no such record.
    @discardableResult
    public func delete<R: SyncRecord>(_ type: R.Type, id: UUID) async throws -> Bool {
        var deleted = false
        try await commit { state in
            let delta = state.delete(type, id: id)
            deleted = delta != nil
            return delta
        }
        return deleted
    }

    public func setSetting(_ key: String, to value: FieldValue?, scope: SettingScope) async throws {
        try await commit { $0.setSetting(key, to: value, scope: scope) }
    }

    /// Runs any change as one transaction and ships its delta.
    public func commit(_ body: (inout ReplicaState) throws -> RecordMap?) async throws {
        guard let delta = try store.write(body) else { return }
        await node?.broadcast(delta)
        publish(ReplicaChange(origin: .local, records: Set(delta.allRecords.map(\.0))))
    }

    /// Ships a delta already committed to the store by this process (a ``batch(_:)``
    /// made on the caller's actor) and publishes it as a local change.
    func shipCommitted(_ delta: RecordMap) async {
        await node?.broadcast(delta)
        publish(ReplicaChange(origin: .local, records: Set(delta.allRecords.map(\.0))))
    }

    // MARK: - Observing

    /// Changes as they are committed: local, from peers, and from other processes (while sync
    /// is on, or ``watchOtherProcesses()`` runs). Each call makes a new subscriber.
    public nonisolated func changes() -> AsyncStream<ReplicaChange> {
        changeSubscribers.subscribe()
    }

    /// The sync status now and whenever it changes.
    public nonisolated func statusUpdates() -> AsyncStream<SyncStatus> {
        let stream = statusSubscribers.subscribe()
        Task { await self.republishStatus() }
        return stream
    }

    public var currentStatus: SyncStatus { status }

    private func republishStatus() { setStatus(status, force: true) }

    private nonisolated func publish(_ change: ReplicaChange) {
        changeSubscribers.yield(change)
    }

    private func setStatus(_ new: SyncStatus, force: Bool = false) {
        guard force || new != status else { return }
        status = new
        statusSubscribers.yield(new)
    }

    // MARK: - Sync

    /// Turns sync on: listens, dials the static peers, shares existing local data with every
    /// peer that connects, and ships other processes' commits. Returns the listening port.
    @discardableResult
    public func startSync(_ configuration: SyncConfiguration) async throws -> Int {
        if node != nil { await stopSync() }
        let node = try SyncNode(
            storage: StoreSyncStorage(store), replicaID: store.replicaID,
            configuration: .init(name: store.state.name, listenHost: configuration.listenHost,
                                 listenPort: configuration.listenPort, security: configuration.security,
                                 maxClockSkew: configuration.maxClockSkew, transfer: configuration.transfer),
            logger: logger)
        let events = node.events()
        self.node = node
        setStatus(.connecting)
        tasks.append(Task { await self.follow(events) })
        let port = try await node.start()
        for peer in configuration.peers { await node.addPeer(host: peer.host, port: peer.port) }
        tasks.append(Task { await self.watchOtherProcesses() })
        if configuration.discovery {
            let discovery = PeerDiscovery()
            self.discovery = discovery
            let advertisement = PeerAdvertisement(
                serviceName: "\(store.state.name) \(replicaID.shortDescription)", port: UInt16(port), replicaID: replicaID,
                groupTag: configuration.groupTag, protocolVersion: Int(WireLimits.protocolVersion))
            let events = discovery.start(advertising: advertisement)
            tasks.append(Task { await self.follow(events, groupTag: configuration.groupTag) })
        }
        return port
    }

    /// Dials discovered peers of this group and protocol version — only those with a higher
    /// replica ID, so exactly one side of each pair dials — and ignores everything else.
    private func follow(_ events: AsyncStream<DiscoveryEvent>, groupTag: String) async {
        for await event in events {
            switch event {
            case .registered(let name):
                logger.info("advertised on the LAN", metadata: ["dnssd.name": "\(name)"])
            case .found(let peer):
                guard let id = peer.replicaID, peer.groupTag == groupTag,
                      peer.protocolVersion == Int(WireLimits.protocolVersion) else {
                    logger.debug("ignoring a discovered node of another group or version", metadata: ["dnssd.name": "\(peer.serviceName)"])
                    continue
                }
                let address = "\(peer.host):\(peer.port)"
                guard id > replicaID, dialedDiscovered[id] != address else { continue }
                dialedDiscovered[id] = address
                logger.info("discovered a peer", metadata: ["peer.id": "\(id.shortDescription)", "peer.address": "\(address)"])
                await node?.addPeer(host: peer.host, port: Int(peer.port))
            case .lost:
                break  // liveness comes from the TCP session, not from DNS-SD
            case .unavailable(let error):
                logger.warning("discovery unavailable: \(error); static peers (--peer) still work")
            case .recovered:
                logger.info("discovery available again")
            }
        }
    }

    /// Adds a peer to dial while sync runs (e.g. one found by discovery).
    public func addPeer(host: String, port: Int) async {
        await node?.addPeer(host: host, port: port)
    }

    /// The connected peers (empty with sync off).
    public func peers() async -> [PeerStatus] {
        await node?.peers() ?? []
    }

    /// Turns sync off. Everything stays local and usable.
    public func stopSync() async {
        let node = self.node
        self.node = nil
        discovery?.stop()
        discovery = nil
        dialedDiscovered = [:]
        for task in tasks { task.cancel() }
        tasks = []
        await node?.stop()
        peerNames = [:]
        setStatus(.disabled)
    }

    /// Polls the store for other processes' commits (every 5 ms) until cancelled, shipping
    /// them to peers and publishing them as changes.
    public func watchOtherProcesses() async {
        do {
            for try await change in store.externalChanges() {
                if let delta = change.delta {
                    await node?.broadcast(delta)
                    publish(ReplicaChange(origin: .otherProcess, records: Set(delta.allRecords.map(\.0))))
                } else {
                    await node?.resyncAll()
                    publish(ReplicaChange(origin: .otherProcess, records: []))
                }
            }
        } catch {
            logger.error("cannot read the store", metadata: ["error": "\(error)"])
            setStatus(.error("\(error)"))
        }
    }

    private func follow(_ events: AsyncStream<NodeEvent>) async {
        for await event in events {
            switch event {
            case .listening:
                if peerNames.isEmpty { setStatus(.connecting) }
            case .peerConnected(let info):
                peerNames[info.replicaID] = info.name
                setStatus(.syncing(progress: nil))
            case .peerDisconnected(let info, _):
                peerNames[info.replicaID] = nil
                if peerNames.isEmpty { setStatus(.connecting) }
            case .sessionRefused(let address, let reason):
                if peerNames.isEmpty { setStatus(.error("\(address): \(reason)")) }
            case .catchUpProgress(_, let chunk, let chunks, _):
                setStatus(.syncing(progress: Double(chunk) / Double(max(chunks, 1))))
            case .converged:
                setStatus(.inSync(lastSync: Date(), peers: peerNames.values.sorted()))
            case .remoteChange(let outcome, let info):
                publish(ReplicaChange(origin: .peer(name: info.name, replicaID: info.replicaID), records: outcome.changedRecords))
                if case .inSync = status { setStatus(.syncing(progress: nil)) }
            }
        }
    }
}

/// Fans values out to any number of `AsyncStream` subscribers.
final class Broadcaster<T: Sendable>: Sendable {
    private let subscribers = Mutex<(next: Int, continuations: [Int: AsyncStream<T>.Continuation])>((0, [:]))

    func subscribe() -> AsyncStream<T> {
        let (stream, continuation) = AsyncStream<T>.makeStream(bufferingPolicy: .bufferingNewest(1_000))
        let id = subscribers.withLock { s in
            defer { s.next += 1 }
            s.continuations[s.next] = continuation
            return s.next
        }
        continuation.onTermination = { [weak self] _ in
            _ = self?.subscribers.withLock { $0.continuations.removeValue(forKey: id) }
        }
        return stream
    }

    func yield(_ value: T) {
        for continuation in subscribers.withLock({ Array($0.continuations.values) }) { continuation.yield(value) }
    }
}
