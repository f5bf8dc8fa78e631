import Foundation
import Logging
import PeerSyncCRDT
import PeerSyncDiscovery
import PeerSyncIdentity
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
    /// Something a person can fix (wrong group, clock skew, port in use, storage).
    case error(SyncIssue)
}

/// What stops sync, in terms a person can act on.
public enum SyncIssue: Sendable, Equatable, CustomStringConvertible {
    /// A session to `address` failed or was refused, and no peer is connected.
    case session(address: String, reason: SessionEndReason)
    /// The local store cannot be read.
    case storage(String)
    /// This device was removed from the group by an admin: it can no longer sync.
    case removedFromGroup

    public var description: String {
        switch self {
        case .session(let address, let reason): "\(address): \(reason)"
        case .storage(let detail): "storage: \(detail)"
        case .removedFromGroup: "this device was removed from the group"
        }
    }
}

extension SyncConfiguration {
    /// Whether this configuration uses TCP at all (listening, dialing or discovery).
    var usesTCP: Bool { listen != nil || !peers.isEmpty || discovery }
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
    /// This device's key (in `device-key.pem`, mode 0600; it never leaves the device).
    public nonisolated let deviceKey: DeviceKey
    /// The sync group this replica belongs to.
    public nonisolated let groupID: GroupID
    /// An upgraded group's old shared secret, if this store had one.
    public nonisolated let legacySecret: GroupSecret?
    /// While this device has not yet joined: the inviter and the entry it presents.
    public private(set) var pendingJoin: PendingJoin?
    private var replicator: Replicator?
    private var node: SyncNode?
    var currentNode: SyncNode? { node }
    private var discovery: PeerDiscovery?
    private var tasks: [Task<Void, Never>] = []
    private var status = SyncStatus.disabled
    private var configuration: SyncConfiguration?
    /// Convergence repairs and refused sessions of the current sync run (Replica+Health.swift).
    var repairs = 0
    var refusedSessions = 0
    nonisolated let healthSubscribers = Broadcaster<SyncHealth>()
    private var peerNames: [ReplicaID: String] = [:]
    private nonisolated let changeSubscribers = Broadcaster<ReplicaChange>()
    private nonisolated let statusSubscribers = Broadcaster<SyncStatus>()
    /// Live observations, peer names and attachments (Replica+Observation.swift and neighbours).
    nonisolated let appSupport = AppSupport()
    /// Runs compaction steps off the actor (Replica+Compaction.swift).
    nonisolated let compactionScheduler = CompactionScheduler()

    /// Opens the replica at `directory`, creating it (named `name`, default the host name) with a
    /// new group of which this device is the first admin if there is none. Fast, never touches
    /// the network.
    public static func open(at directory: String, name: String? = nil, logger: Logger = Logger(label: "peersync")) throws -> Replica {
        guard FileManager.default.fileExists(atPath: ReplicaStore.path(in: directory)) else {
            return try create(at: directory, name: name ?? ProcessInfo.processInfo.hostName, logger: logger)
        }
        return try Replica(store: ReplicaStore.open(directory: directory), directory: directory, logger: logger)
    }

    /// A replica over an open store in `directory` (where its device key lives). A store made by
    /// the previous version is upgraded here: it gets a device key and a group.
    public init(store: ReplicaStore, directory: String, logger: Logger) throws {
        self.store = store
        self.directory = directory
        self.logger = logger
        let setup = try Self.setUp(store, directory: directory)
        deviceKey = setup.key
        groupID = setup.groupID
        legacySecret = setup.legacySecret
        pendingJoin = setup.pendingJoin
    }

    /// This device's ID (a fingerprint of its public key).
    public nonisolated var deviceID: DeviceID { deviceKey.deviceID }

    /// The identity sessions use.
    var identity: LocalIdentity {
        LocalIdentity(key: deviceKey, groupID: groupID, pendingJoin: pendingJoin, legacySecret: legacySecret)
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
        await replicator?.broadcast(delta)
        publish(ReplicaChange(origin: .local, records: Set(delta.allRecords.map(\.0))))
        scheduleCompaction()
    }

    /// Ships a delta already committed to the store by this process (a ``batch(_:)``
    /// made on the caller's actor) and publishes it as a local change.
    func shipCommitted(_ delta: RecordMap) async {
        await node?.broadcast(delta)
        publish(ReplicaChange(origin: .local, records: Set(delta.allRecords.map(\.0))))
        scheduleCompaction()
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

    /// Turns sync on: listens and dials as `configuration` says, shares existing local data
    /// with every peer that connects, and ships other processes' commits. Returns the listening
    /// port (0 if not listening). Calling it again restarts sync with the new configuration.
    @discardableResult
    public func startSync(_ configuration: SyncConfiguration) async throws -> UInt16 {
        if replicator != nil { await stopSync() }
        self.configuration = configuration
        (repairs, refusedSessions) = (0, 0)
        if let change = store.incarnationChange {
            logger.warning("this store was copied or restored", metadata: ["replica.id": "\(change.current.shortDescription)",
                                                                           "replica.previous": "\(change.previous.shortDescription)"])
        }
        let replicator = Replicator(storage: StoreSyncStorage(store), replicaID: store.replicaID, name: store.state.name,
                                    identity: identity, configuration: configuration, logger: logger)
        self.replicator = replicator
        setStatus(.connecting)
        tasks.append(Task { await self.follow(replicator.events()) })
        tasks.append(Task { await self.watchOtherProcesses() })
        guard configuration.usesTCP else { return 0 }
        let node = try SyncNode(replicator: replicator, logger: logger)
        self.node = node
        let port = try await node.start()
        if configuration.discovery {
            let discovery = PeerDiscovery()
            self.discovery = discovery
            let advertisement = PeerAdvertisement(
                serviceName: "\(store.state.name) \(replicaID.shortDescription)", port: port, replicaID: replicaID,
                groupTag: groupID.discoveryTag, protocolVersion: Int(WireLimits.protocolVersion))
            let events = discovery.start(advertising: advertisement)
            tasks.append(Task { await self.follow(events, groupTag: self.groupID.discoveryTag) })
        }
        return port
    }

    /// Opens a sync session over a transport the app runs (MultipeerConnectivity, Network.framework,
    /// a WebSocket…): bytes in, bytes out, with the same catch-up, deltas and checks as TCP. Turns
    /// sync on without TCP if it is off. See ``SyncSession``.
    public func openSession(address: String, initiator: Bool) async throws -> SyncSession {
        if replicator == nil { try await startSync(SyncConfiguration(security: .insecure, listen: nil)) }
        return await SyncSession.open(on: replicator!, address: address, initiator: initiator)
    }

    /// Dials discovered peers of this group and protocol version — only those with a higher
    /// replica ID, so exactly one side of each pair dials — and ignores everything else. The
    /// node's dial scheduler bounds the attempts (forged adverts cannot starve a real peer);
    /// withdrawn adverts are dropped from it.
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
                let address = PeerAddress(host: peer.host, port: peer.port)
                guard id > replicaID else { continue }
                logger.info("discovered a peer", metadata: ["peer.id": "\(id.shortDescription)", "peer.address": "\(address)"])
                await node?.discovered(address, serviceName: peer.serviceName)
            case .lost(let serviceName):
                // Not redialed once its session ends; liveness comes from the session, not DNS-SD.
                await node?.lost(serviceName: serviceName)
            case .unavailable(let error):
                logger.warning("discovery unavailable: \(error); static peers still work")
            case .recovered:
                logger.info("discovery available again")
            }
        }
    }

    /// Adds a peer to dial while sync runs over TCP (e.g. one found by discovery).
    public func addPeer(_ address: PeerAddress) async {
        await node?.addPeer(address)
    }

    /// The connected peers (empty with sync off).
    public func peers() async -> [PeerStatus] {
        await replicator?.peers() ?? []
    }

    /// Bytes and frames of every session so far (zero with sync off).
    public func traffic() async -> TrafficCounters {
        await replicator?.traffic() ?? TrafficCounters()
    }

    /// Turns sync off: a goodbye to every peer (flushed before each connection closes), then
    /// everything stays local and usable.
    public func stopSync() async {
        let (node, replicator) = (self.node, self.replicator)
        self.node = nil
        self.replicator = nil
        // Withdraw the advertisement before returning (a quick restart must not see it twice).
        await discovery?.stopAndWait()
        discovery = nil
        for task in tasks { task.cancel() }
        tasks = []
        if let node { await node.stop() } else { await replicator?.shutdown() }
        peerNames = [:]
        setStatus(.disabled)
    }

    /// Polls the store for other processes' commits (every 5 ms) until cancelled, shipping
    /// them to peers and publishing them as changes.
    public func watchOtherProcesses() async {
        do {
            for try await change in store.externalChanges() {
                if let delta = change.delta {
                    await replicator?.broadcast(delta)
                    publish(ReplicaChange(origin: .otherProcess, records: Set(delta.allRecords.map(\.0))))
                } else {
                    await replicator?.resyncAll()
                    publish(ReplicaChange(origin: .otherProcess, records: []))
                }
            }
        } catch {
            logger.error("cannot read the store", metadata: ["error": "\(error)"])
            setStatus(.error(.storage("\(error)")))
        }
    }

    /// Drops what a removed device wrote past its cutoff and reached this replica before it
    /// learned of the removal (members that knew refused it on receipt), so every member ends
    /// with the same data. The dots stay in the context: those writes are never offered again.
    func purgeRefusedWrites(_ roster: Roster) {
        guard roster.devices.values.contains(where: { !$0.isActive }) || !roster.banned.isEmpty else { return }
        do {
            let purged = try store.replaceRecords(reason: "writes of removed devices") { state in
                guard let stripped = state.records.strippingRefused(by: roster) else { return [:] }
                let kept = Dictionary(uniqueKeysWithValues: stripped.delta.allRecords.map { ($0.0, $0.1) })
                var replacements: [RecordKey: RecordState?] = [:]
                for (key, record) in state.records.allRecords where kept[key] != record { replacements[key] = kept[key] }
                return replacements
            }
            if purged > 0 {
                logger.info("dropped writes a removed device made past its cutoff", metadata: ["records": "\(purged)"])
                publish(ReplicaChange(origin: .local, records: []))
            }
        } catch {
            logger.error("cannot drop a removed device's writes", metadata: ["error": "\(error)"])
        }
    }

    // MARK: - Bundles

    /// A sync bundle: what a device with context `peerContext` lacks (everything for nil),
    /// encrypted for `recipients` (the context's device, or every active device of the roster
    /// for nil) and signed by this device. Carry it on a USB stick or by mail;
    /// ``applyBundle(_:)`` on the other device.
    ///
    /// - Throws: ``BundleError/notJoined`` for everyone (nil) before this device's join completed:
    ///   it knows no member's key yet.
    public nonisolated func makeBundle(for peer: BundleContext?) throws(BundleError) -> [UInt8] {
        let state = store.state
        let delta = peer.map { state.delta(missingFrom: $0.context) } ?? state.records
        let members = roster().activeDevices.map(\.publicKey)
        if peer == nil, !members.contains(deviceKey.publicKey) { throw .notJoined }
        let recipients = peer.map { [$0.device] } ?? members
        let header = SyncBundle.Header(groupID: groupID, sender: deviceKey.publicKey, senderReplica: replicaID,
                                       senderName: state.name, createdAt: HybridLogicalClock.wallClock(),
                                       records: UInt64(delta.recordCount))
        return SyncBundle.seal(delta, header: header, senderKey: deviceKey, recipients: recipients)
    }

    /// This replica's context as a file signed by this device, for ``makeBundle(for:)`` elsewhere.
    public nonisolated func bundleContext() -> [UInt8] {
        SyncBundle.sealContext(store.state.context, replica: replicaID, groupID: groupID, key: deviceKey)
    }

    /// Reads a context file made by a device of this group.
    public nonisolated func readBundleContext(_ bytes: [UInt8]) throws(BundleError) -> BundleContext {
        try SyncBundle.openContext(bytes, groupID: groupID)
    }

    /// Applies a sync bundle made for this device by an active member, in one transaction, with
    /// the checks a peer's delta passes, and ships what it changed to connected peers. Applying
    /// it twice changes nothing.
    ///
    /// - Throws: ``BundleError`` (nothing is applied), or a storage error.
    @discardableResult
    public func applyBundle(_ bytes: [UInt8], maxClockSkew: Duration = .seconds(300))
        async throws -> (header: SyncBundle.Header, outcome: MergeOutcome)
    {
        let roster = self.roster()
        let (header, delta) = try SyncBundle.open(bytes, groupID: groupID, me: deviceKey)
        if let refusal = DeltaAdmission.refusal(of: delta, now: HybridLogicalClock.wallClock(),
                                                maxSkewMilliseconds: UInt64(max(0, maxClockSkew.wholeMilliseconds))) {
            throw BundleError.refused(refusal)
        }
        let validation = roster.validate(delta: delta)
        if let refusal = validation.refused.first { throw BundleError.refused("roster entry: \(refusal)") }
        // The sender must be a member — counting the roster entries it brings (a joiner's bundle
        // carries its enrol) — or, while this device joins, its inviter.
        let sender = header.sender.deviceID
        guard validation.roster.isActive(sender) || sender == pendingJoin?.inviter else {
            throw BundleError.unknownSender(sender.shortForm)
        }
        if let replica = delta.unclaimedReplica(roster: validation.roster, known: store.state.context) {
            throw BundleError.refused("it holds writes by replica \(replica.shortDescription), which no device of the group claims")
        }
        let admitted = delta.strippingRefused(by: validation.roster)?.delta ?? delta
        let outcome = try store.applyRemote(admitted, from: "bundle:\(header.sender.deviceID.shortForm)")
        if !outcome.isEmpty {
            await replicator?.broadcast(admitted)
            publish(ReplicaChange(origin: .peer(name: header.senderName, replicaID: header.senderReplica), records: outcome.changedRecords))
        }
        if pendingJoin != nil, self.roster().isActive(deviceID) {
            pendingJoin = nil  // joined through the bundle: the inviter's roster admits this device
            try store.setMembership(GroupMembership(groupID: groupID.bytes))
        }
        return (header, outcome)
    }

    private func follow(_ events: AsyncStream<NodeEvent>) async {
        for await event in events {
            switch event {
            case .listening:
                if peerNames.isEmpty { setStatus(.connecting) }
            case .peerConnected(let info):
                peerNames[info.replicaID] = info.name
                setStatus(.syncing(progress: nil))
            case .peerDisconnected(let info, let reason):
                peerNames[info.replicaID] = nil
                if case .peerClosed(.deviceRemoved, _) = reason {
                    // A member's roster says this device was removed: nobody will sync with it.
                    setStatus(.error(.removedFromGroup))
                } else if peerNames.isEmpty, case .peerClosed(let code, _) = reason,
                          ![.normal, .shuttingDown, .duplicateConnection].contains(code) {
                    // The peer refused us (an invite it would not take, clock skew, …): say why.
                    setStatus(.error(.session(address: info.address, reason: reason)))
                } else if peerNames.isEmpty {
                    setStatus(.connecting)
                }
            case .sessionRefused(_, .peerClosed(.deviceRemoved, _)):
                setStatus(.error(.removedFromGroup))
            case .sessionRefused(let address, let reason):
                if peerNames.isEmpty { setStatus(.error(.session(address: address, reason: reason))) }
                if case .refused(.overloaded, _) = reason {
                    refusedSessions += 1
                    await publishHealth()
                }
            case .connectionsRefused:
                await publishHealth()
            case .catchUpProgress(_, let chunk, let chunks, _):
                setStatus(.syncing(progress: Double(chunk) / Double(max(chunks, 1))))
            case .converged:
                setStatus(.inSync(lastSync: Date(), peers: peerNames.values.sorted()))
            case .divergenceRepaired(_, let count):
                repairs = count
                await publishHealth()
            case .divergenceDetail:
                break
            case .restoredStoreDetected(let info, let replica, let known, let held):
                guard replica == store.replicaID, let configuration else { break }
                let reason = "peer \(info.name) knows \(known) writes by this replica, the store has \(held): it was restored from an older copy"
                do {
                    let change = try store.beginNewIncarnation(reason: reason)
                    try Self.claimReplicaID(store, key: deviceKey, groupID: groupID)
                    logger.warning("this store was restored from an older copy; continuing as a new replica",
                                   metadata: ["replica.id": "\(change.current.shortDescription)", "replica.previous": "\(replica.shortDescription)"])
                } catch {
                    logger.error("cannot continue as a new replica", metadata: ["error": "\(error)"])
                    setStatus(.error(.storage("\(error)")))
                    break
                }
                // Sessions announce the replica ID: start them again under the new one.
                Task { try? await self.startSync(configuration) }
            case .joined:
                pendingJoin = nil
                do {
                    try store.setMembership(GroupMembership(groupID: groupID.bytes))
                } catch {
                    logger.error("cannot record the completed join", metadata: ["error": "\(error)"])
                }
            case .rosterChanged(let roster, let removedSelf):
                if removedSelf { setStatus(.error(.removedFromGroup)) }
                purgeRefusedWrites(roster)
            case .gossipReceived:
                scheduleCompaction()
            case .localChange(let delta):
                publish(ReplicaChange(origin: .local, records: Set(delta.allRecords.map(\.0))))
            case .remoteChange(let outcome, let info):
                publish(ReplicaChange(origin: .peer(name: info.name, replicaID: info.replicaID), records: outcome.changedRecords))
                scheduleCompaction()
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
