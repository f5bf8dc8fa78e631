import Foundation
import Logging
@_spi(Engine) import PeerSyncCRDT
import PeerSyncDiscovery
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncReplication
import PeerSyncNetwork
import PeerSyncStore
import PeerSyncWire
import Synchronization

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
    package nonisolated let store: ReplicaStore
    /// The directory holding the store and the device key; empty for a replica in memory
    /// (``inMemory(name:groupName:logger:)``, ``isInMemory``).
    public nonisolated let directory: String
    nonisolated let logger: Logger
    /// This device's key (in `device-key.pem`, mode 0600; it never leaves the device).
    package nonisolated let deviceKey: DeviceKey
    /// The sync group this replica belongs to.
    package nonisolated let groupID: GroupID
    /// An upgraded group's old shared secret, if this store had one.
    package nonisolated let legacySecret: GroupSecret?
    /// While this device has not yet joined: the inviter and the entry it presents.
    package internal(set) var pendingJoin: PendingJoin?
    var replicator: Replicator?
    private var node: SyncNode?
    var currentNode: SyncNode? { node }
    private var discovery: PeerDiscovery?
    private var tasks: [Task<Void, Never>] = []
    /// Sessions with relays (``SyncConfiguration/relays``) and the tasks running them.
    var relayLinks: [RelayLink] = []
    var relayTasks: [Task<Void, Never>] = []
    private(set) var status = SyncStatus.disabled
    /// This device's removal as sync learned it; while set, the sync status says so (Replica+Devices.swift).
    var removalNoted: RemovalNotice?
    var configuration: SyncConfiguration?
    /// ``close()`` ran.
    var isClosed = false
    /// Convergence repairs and refused sessions of the current sync run (Replica+Health.swift).
    var repairs = 0
    var refusedSessions = 0
    /// Divergences the watchdog could not repair, by peer replica (``SyncHealth/divergences``).
    var divergences: [ReplicaID: SyncHealth.Divergence] = [:]
    nonisolated let healthSubscribers = Broadcaster<SyncHealth>()
    var peerNames: [ReplicaID: String] = [:]
    private nonisolated let statusSubscribers = Broadcaster<SyncStatus>()
    /// Live observations, peer names and attachments (Replica+Observation.swift and neighbours).
    nonisolated let appSupport = AppSupport()
    /// Runs compaction steps off the actor (Replica+Compaction.swift).
    nonisolated let compactionScheduler = CompactionScheduler()

    /// Opens the replica at `directory`, creating it (named `name`, default the host name) with a new group
    /// of which this device is the first admin if there is none. Fast, never touches the network.
    /// PeerSync logs to `logger` (debug and trace; warnings only for what the app must act on); by
    /// default it logs nothing.
    public static func open(at directory: String, name: String? = nil,
                            logger: Logger = Logger(label: "peersync", factory: { _ in SwiftLogNoOpLogHandler() })) throws(ReplicaError) -> Replica {
        try ReplicaError.wrapping { try openOrCreate(at: directory, name: name, logger: logger) }
    }

    private static func openOrCreate(at directory: String, name: String?, logger: Logger) throws -> Replica {
        try finishInterruptedRehome(directory)
        guard FileManager.default.fileExists(atPath: ReplicaStore.path(in: directory)) else {
            return try create(at: directory, name: name ?? ProcessInfo.processInfo.hostName, logger: logger)
        }
        return try Replica(store: ReplicaStore.open(directory: directory), directory: directory, logger: logger)
    }

    /// A replica over an open store in `directory` (where its device key lives). A store made by
    /// the previous version is upgraded here: it gets a device key and a group.
    package init(store: ReplicaStore, directory: String, logger: Logger) throws {
        self.store = store
        self.directory = directory
        self.logger = logger
        let setup = try Self.setUp(store, directory: directory)
        deviceKey = setup.key
        groupID = setup.groupID
        legacySecret = setup.legacySecret
        pendingJoin = setup.pendingJoin
    }

    /// A replica over a store without a directory (Replica+InMemory.swift), with its device key
    /// held in memory: nothing of it is read from or written to a directory.
    init(store: ReplicaStore, key: DeviceKey, logger: Logger) throws {
        self.store = store
        directory = ""
        self.logger = logger
        let setup = try Self.setUp(store, key: key, legacySecret: nil)
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

    /// This replica's ID: the writer of its changes (a device's store has one; a copied or
    /// restored store takes a new one).
    public nonisolated var replicaID: ReplicaID { store.replicaID }
    /// The current state (a snapshot; cheap).
    package nonisolated var state: ReplicaState { store.state }

    // MARK: - Reading

    /// The record of type `R` with this ID, or nil if there is none (or it was deleted).
    public nonisolated func fetch<R: SyncRecord>(_ type: R.Type, id: UUID) throws(ReplicaError) -> R? {
        let state = store.state
        let record = try ReplicaError.wrapping(otherwise: ReplicaError.invalidRecord) { try state.fetch(type, id: id) }
        if record != nil, let raw = state.records.record(RecordKey(collection: R.collection, id: id)) {
            appSupport.reads.note(RecordKey(collection: R.collection, id: id), raw)
        }
        return record
    }

    /// Every record of type `R`.
    public nonisolated func fetchAll<R: SyncRecord>(_ type: R.Type) throws(ReplicaError) -> [R] {
        try fetchAll(RecordQuery(type))
    }

    /// The setting `key` in `scope`, or nil if it is not set.
    public nonisolated func setting(_ key: String, scope: SettingScope) -> FieldValue? {
        store.state.setting(key, scope: scope)
    }

    // MARK: - Writing

    /// Saves `record`, creating it or writing the fields in which it differs from the record as
    /// stored now. Returns once committed to disk; peers receive it at once if sync is on
    /// (every commit reaches them the same way: the replicator follows the store's commit feed).
    ///
    /// A copy read before another device changed the record is refused, not saved: if a field
    /// the copy would write holds a value this replica handed out earlier (a fetch, a query, a
    /// live result) and another device has changed it since, saving would put the old value
    /// back on every device. Then nothing is written and it throws ``ReplicaError/staleCopy(_:)``.
    /// An edit sheet that holds a record while others may change it saves what the user
    /// changed instead:
    ///
    /// ```swift
    /// try await replica.save(edited, editedFrom: original)          // the fields the user changed
    /// try await replica.update(Shift.self, id: shift.id) { $0.assignee = "Ben" }
    /// ```
    public func save<R: SyncRecord>(_ record: R) async throws(ReplicaError) {
        let ledger = appSupport.reads
        try await ReplicaError.wrapping {
            try await commit { state in
                let now = state
                try Self.refuseStaleCopy(record, in: now, ledger: ledger, names: { self.writerName(of: $0, in: now) })
                return try state.save(record)
            }
        }
    }

    /// Writes the fields in which `record` differs from `original`, the copy it was edited from,
    /// and only those: a field someone else changed meanwhile keeps their value unless the user
    /// changed it too (then the later write wins, as for any concurrent edit). Throws
    /// ``ReplicaError/recordNotFound(_:)`` if the record was deleted since (nothing is revived).
    public func save<R: SyncRecord>(_ record: R, editedFrom original: R) async throws(ReplicaError) {
        try await ReplicaError.wrapping { try await commit { try $0.save(record, editedFrom: original) } }
    }

    /// Changes the record of `type` with `id` as it is now and writes exactly the fields `change`
    /// changed: `replica.update(Shift.self, id: id) { $0.assignee = "Ben" }`. Returns the record
    /// as saved. Throws ``ReplicaError/recordNotFound(_:)`` if there is no such record.
    @discardableResult
    public func update<R: SyncRecord>(_ type: R.Type, id: UUID, _ change: (inout R) -> Void) async throws(ReplicaError) -> R {
        var updated: R?
        try await ReplicaError.wrapping {
            try await commit { state in
                let (record, delta) = try state.update(type, id: id, change)
                updated = record
                return delta
            }
        }
        return updated!
    }

    /// Throws ``ReplicaError/staleCopy(_:)`` if saving `record` would write, into a field another
    /// device changed since, a value this replica handed out before that change.
    static func refuseStaleCopy<R: SyncRecord>(_ record: R, in state: ReplicaState, ledger: ReadLedger,
                                               names: (ReplicaID) -> String?) throws {
        guard let writing = try state.fieldsSaveWouldWrite(record) else { return }
        let stale = ledger.staleFields(of: record.recordKey, writing: writing, current: state.records.record(record.recordKey),
                                       local: state.replicaID)
        guard !stale.isEmpty else { return }
        let changes = stale.map { "\($0.field) (changed by \(names($0.writer) ?? "another device"))" }
        throw ReplicaError.staleCopy("""
            \(record.recordKey): this copy was read before \(changes.joined(separator: ", ")); saving it would put the old \
            value\(stale.count == 1 ? "" : "s") back, so nothing was saved. Write the fields you changed with \
            update(\(R.self).self, id:) or save(_:editedFrom:), or read the record again
            """)
    }

    /// Deletes a record. Returns false if there was no such record.
    @discardableResult
    public func delete<R: SyncRecord>(_ type: R.Type, id: UUID) async throws(ReplicaError) -> Bool {
        var deleted = false
        try await ReplicaError.wrapping {
            try await commit { state in
                let delta = state.delete(type, id: id)
                deleted = delta != nil
                return delta
            }
        }
        return deleted
    }

    /// Sets (or, with nil, removes) the setting `key` in `scope`: a synced one reaches every
    /// device of the group, a local one never leaves this device.
    public func setSetting(_ key: String, to value: FieldValue?, scope: SettingScope) async throws(ReplicaError) {
        try await ReplicaError.wrapping { try await commit { $0.setSetting(key, to: value, scope: scope) } }
    }

    /// Runs any change as one transaction. Like every commit to the store, it reaches peers
    /// and ``changes()`` through the store's commit feed.
    package func commit(_ body: (inout ReplicaState) throws -> RecordMap?) async throws {
        guard try store.write(body) != nil else { return }
        scheduleCompaction()
    }

    // MARK: - Observing

    /// Changes as they are committed: local, from peers, and from other processes (while sync
    /// is on, or ``watchOtherProcesses()`` runs). Each call makes a new subscriber that sees
    /// every change committed after the call. Lossless: a reader that falls behind gets what
    /// changed meanwhile coalesced — one change per origin naming every record — never less.
    public nonisolated func changes() -> ReplicaChanges {
        ReplicaChanges(store.commits.subscribe(CommitInterest(collections: nil, origins: true)))
    }

    /// The sync status now and whenever it changes.
    public nonisolated func statusUpdates() -> AsyncStream<SyncStatus> {
        let stream = statusSubscribers.subscribe()
        Task { await self.republishStatus() }
        return stream
    }

    /// The sync status now.
    public var currentStatus: SyncStatus { status }

    private func republishStatus() { setStatus(status, force: true) }

    func setStatus(_ new: SyncStatus, force: Bool = false) {
        let new = removalNoted.map { new == .disabled ? new : .error(.removedFromGroup($0)) } ?? new
        guard force || new != status else { return }
        status = new
        statusSubscribers.yield(new)
    }

    // MARK: - Sync

    /// Turns sync on: listens and dials as `configuration` says, shares existing local data
    /// with every peer that connects, and ships other processes' commits. Returns the listening
    /// port (0 if not listening). Calling it again restarts sync with the new configuration.
    @discardableResult
    public func startSync(_ configuration: SyncConfiguration) async throws(ReplicaError) -> UInt16 {
        try await ReplicaError.wrapping(otherwise: ReplicaError.network) { try await startSyncing(configuration) }
    }

    private func startSyncing(_ configuration: SyncConfiguration) async throws -> UInt16 {
        if replicator != nil { await stopSync() }
        self.configuration = configuration
        (repairs, refusedSessions) = (0, 0)
        divergences = [:]
        if let change = store.incarnationChange {
            logger.warning("this store was copied or restored", metadata: ["replica.id": "\(change.current.shortDescription)",
                                                                           "replica.previous": "\(change.previous.shortDescription)"])
        }
        let replicator = Replicator(storage: StoreSyncStorage(store, key: deviceKey, groupID: groupID), replicaID: store.replicaID, name: store.state.name,
                                    identity: identity, configuration: configuration, logger: logger)
        self.replicator = replicator
        noteRemoval(in: roster())
        setStatus(.connecting)
        tasks.append(Task { await self.follow(replicator.controlEvents()) })
        tasks.append(Task { await self.watchOtherProcesses() })
        // What the stored reports already allow: a process killed between receiving the last
        // report and its compaction step would otherwise wait for the next commit or report,
        // which in a quiet group never comes. (Only if something deleted is held: nothing else
        // for a step to do.)
        if store.state.records.invisibleRecordCount > 0 { scheduleCompaction() }
        startRelays(configuration)
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
    public func openSession(address: String, initiator: Bool) async throws(ReplicaError) -> SyncSession {
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
                await node?.discovered(address, serviceName: peer.serviceName, replicaID: id)
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
        await stopRelays()
        if let node { await node.stop() } else { await replicator?.shutdown() }
        peerNames = [:]
        setStatus(.disabled)
    }
}

extension SyncConfiguration {
    /// Whether this configuration uses TCP at all (listening, dialing or discovery).
    var usesTCP: Bool { listen != nil || !peers.isEmpty || discovery }
}
