import ArgumentParser
import Foundation
import Logging
import PeerSync
import ServiceLifecycle

struct Run: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Sync in the foreground until SIGINT or SIGTERM, logging to stderr.",
        discussion: """
            Listens for peers, dials every --peer (again and again, with backoff, while it is \
            down), and ships changes other `peersync` commands make to the same store within \
            milliseconds.
            """)

    @OptionGroup var options: StoreOptions
    @Option(help: "Address to listen on.") var listen: String = "0.0.0.0:7946"
    @Option(name: .customLong("peer"), help: "A peer to dial, HOST:PORT (repeatable).") var peers: [String] = []
    @Option(name: .customLong("relay"), help: "A relay of the group to dial, HOST:PORT (repeatable; docs/RELAY.md).") var relays: [String] = []
    @Flag(help: "Do not advertise or look for peers on the LAN (DNS-SD); use only --peer.") var noDiscovery = false
    @Flag(help: "Plain TCP instead of TLS, for debugging only: devices still prove their keys and the roster still admits them, but nothing is encrypted, so anyone on the network can read and change the data in transit.")
    var insecure = false
    @Option(help: "Refuse peers whose clock differs by more than this many seconds.") var maxClockSkew: Int = 300
    @Option(help: "trace, debug, info, notice, warning, error or critical.") var logLevel: String = "info"
    @OptionGroup(title: "Limits (docs/SECURITY.md)") var limits: LimitOptions
    @Flag(help: "Also read edit commands from standard input and report peers' changes on standard output (for scripts and benchmarks; docs/CLI.md).")
    var commands = false

    func run() async throws {
        guard let level = Logger.Level(rawValue: logLevel) else { throw CLIError("unknown log level \"\(logLevel)\"") }
        let listenAddress = try parseHostPort(listen)
        let peerAddresses = try peers.map(parseHostPort)
        let relayAddresses = try relays.map(parseHostPort)
        let security: SessionSecurity = insecure ? .insecure : .tls
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        let logger = Logger(label: "peersync")
        let replica = try options.openReplica(logger: logger)
        let service = NodeService(
            replica: replica, statusFile: (options.directory as NSString).appendingPathComponent("node.json"),
            configuration: configuration(security: security, listen: listenAddress, peers: peerAddresses, relays: relayAddresses),
            insecure: insecure, commands: commands, logger: logger)
        let group = ServiceGroup(services: [service], gracefulShutdownSignals: [.sigterm, .sigint], cancellationSignals: [], logger: logger)
        try await group.run()
    }

    func configuration(security: SessionSecurity, listen: PeerAddress, peers: [PeerAddress], relays: [PeerAddress] = []) -> SyncConfiguration {
        var timing = SyncTiming()
        timing.maxClockSkew = .seconds(maxClockSkew)
        timing.handshakeTimeout = .milliseconds(Int64((limits.handshakeTimeout * 1000).rounded()))
        return SyncConfiguration(security: security, listen: listen, peers: peers, discovery: !noDiscovery, timing: timing,
                                 limits: limits.syncLimits, relays: relays)
    }
}

/// `peersync run`'s options for ``SyncLimits`` (and the handshake timeout of ``SyncTiming``);
/// each default is the library's.
struct LimitOptions: ParsableArguments {
    static let defaults = SyncLimits()

    @Option(help: "Inbound connections open at once, from every address together; more are closed on arrival.")
    var maxConnections = defaults.inboundConnections
    @Option(help: "Inbound connections open at once from one IP address; more are closed on arrival.")
    var maxConnectionsPerAddress = defaults.inboundConnectionsPerAddress
    @Option(help: "Established sessions at once; more are refused (overloaded).")
    var maxSessions = defaults.sessions
    @Option(help: "Seconds a connection has for its TLS handshake, then again for hello, authentication and admission.")
    var handshakeTimeout = SyncTiming().handshakeTimeout.millisecondsDouble / 1000
    @Option(help: "Connection attempts to peers running at once.")
    var maxDials = defaults.concurrentDials
    @Option(help: "Connection attempts running at once to one host.")
    var maxDialsPerHost = defaults.concurrentDialsPerHost
    @Option(help: "Longest wait in seconds before redialing a peer whose sessions fail to authenticate or are refused (the wait starts at 5 s and doubles).")
    var rejectedBackoffMax = defaults.rejectedDialBackoff.max.millisecondsDouble / 1000

    func validate() throws {
        for (name, value) in [("--max-connections", maxConnections), ("--max-connections-per-address", maxConnectionsPerAddress),
                              ("--max-sessions", maxSessions), ("--max-dials", maxDials), ("--max-dials-per-host", maxDialsPerHost)]
            where value < 1 {
            throw ArgumentParser.ValidationError("\(name) must be at least 1, got \(value)")
        }
        guard handshakeTimeout.isFinite, handshakeTimeout >= 0.1, handshakeTimeout <= 3600 else {
            throw ArgumentParser.ValidationError("--handshake-timeout must be between 0.1 and 3600 seconds, got \(handshakeTimeout)")
        }
        guard rejectedBackoffMax.isFinite, rejectedBackoffMax >= 1, rejectedBackoffMax <= 86400 else {
            throw ArgumentParser.ValidationError("--rejected-backoff-max must be between 1 and 86400 seconds, got \(rejectedBackoffMax)")
        }
    }

    var syncLimits: SyncLimits {
        var limits = SyncLimits()
        limits.inboundConnections = maxConnections
        limits.inboundConnectionsPerAddress = maxConnectionsPerAddress
        limits.sessions = maxSessions
        limits.concurrentDials = maxDials
        limits.concurrentDialsPerHost = maxDialsPerHost
        let longest = Duration.milliseconds(Int64((rejectedBackoffMax * 1000).rounded()))
        limits.rejectedDialBackoff = Backoff(first: min(limits.rejectedDialBackoff.first, longest), max: longest)
        return limits
    }
}

/// What `peersync run` writes to DIR/node.json every second, for `peersync status`.
struct NodeStatusFile: Codable {
    struct Peer: Codable {
        var replicaID: String
        var deviceID: String?
        var name: String
        var address: String
        var dialed: Bool
        var lastConvergedAt: Date?
        var bytesSent: Int
        var bytesReceived: Int
    }
    /// The convergence watchdog's repairs and what the limits refused (docs/CLI.md).
    struct Health: Codable {
        var repairs: Int
        var refusedSessions: Int
        var refusedConnectionsOverTotal: Int
        var refusedConnectionsOverAddress: Int
        var inboundConnections: Int
        var dialTargets: Int
        var dialing: Int
        var dialingPeak: Int
        var rejectedDialTargets: Int
        var dialAttempts: Int
        /// Peers whose digests still differ after a repair: "peer name (ID): collections …, records …".
        var divergences: [String]?

        init(_ health: SyncHealth) {
            repairs = health.repairs
            refusedSessions = health.refusedSessions
            refusedConnectionsOverTotal = health.limits.refusedOverTotal
            refusedConnectionsOverAddress = health.limits.refusedOverAddress
            inboundConnections = health.limits.inboundOpen
            dialTargets = health.limits.dialTargets
            dialing = health.limits.dialing
            dialingPeak = health.limits.dialingPeak
            rejectedDialTargets = health.limits.rejectedTargets
            dialAttempts = health.limits.dialAttempts
            divergences = health.divergences.isEmpty ? nil : health.divergences.map { divergence in
                "\(divergence.peerName) (\(divergence.peer)): collections \(divergence.collections.joined(separator: ",")), "
                    + "writers \(divergence.writers.joined(separator: ",")), records \(divergence.records.joined(separator: ","))"
            }
        }
    }
    /// The limits the node runs with.
    struct Limits: Codable {
        var maxConnections: Int
        var maxConnectionsPerAddress: Int
        var maxSessions: Int
        var handshakeTimeoutSeconds: Double
        var maxDials: Int
        var maxDialsPerHost: Int
        var rejectedBackoffMaxSeconds: Double

        init(_ configuration: SyncConfiguration) {
            let limits = configuration.limits
            maxConnections = limits.inboundConnections
            maxConnectionsPerAddress = limits.inboundConnectionsPerAddress
            maxSessions = limits.sessions
            handshakeTimeoutSeconds = configuration.timing.handshakeTimeout.millisecondsDouble / 1000
            maxDials = limits.concurrentDials
            maxDialsPerHost = limits.concurrentDialsPerHost
            rejectedBackoffMaxSeconds = limits.rejectedDialBackoff.max.millisecondsDouble / 1000
        }
    }
    var pid: Int32
    var listen: String
    var insecure: Bool
    var startedAt: Date
    var updatedAt: Date
    var peers: [Peer]
    /// Absent in status files of older versions.
    var health: Health?
    var limits: Limits?
    /// Set once the node learned that this device was removed (``RemovalNotice``).
    var removal: String?
    /// The relays the node dials (absent before issue 33).
    var relays: [RelayEntry]?

    struct RelayEntry: Codable {
        var address: String
        var relay: String?
        var connected: Bool
        var lastUpload: Date?
        var pending: UInt64
        var withheld: [String]
        var refusedBlobs: Int
        var lastError: String?

        init(_ status: RelayStatus) {
            address = status.address
            relay = status.relay
            connected = status.connected
            lastUpload = status.lastUpload
            pending = status.pending
            withheld = status.withheld
            refusedBlobs = status.refusedBlobs
            lastError = status.lastError
        }
    }
}

struct NodeService: Service {
    let replica: Replica
    let statusFile: String
    let configuration: SyncConfiguration
    let insecure: Bool
    var commands = false
    let logger: Logger

    func run() async throws {
        let port = try await replica.startSync(configuration)
        logger.info("peersync node running", metadata: [
            "replica.id": "\(replica.replicaID.shortDescription)", "listen.port": "\(port)",
            "peers.static": "\(configuration.peers.count)", "discovery": "\(configuration.discovery)",
        ])
        let started = Date()
        let progress = Task { await showProgress() }
        defer { progress.cancel() }
        let input = commands ? Task { await CommandInput.run(replica) } : nil
        defer { input?.cancel() }
        await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                await writeStatus(port: port, started: started)
                try? await Task.sleep(for: .milliseconds(500))
            }
        }
        logger.info("stopping")
        await replica.stopSync()
        try? FileManager.default.removeItem(atPath: statusFile)
    }

    /// On a terminal, long catch-ups show a progress line on stderr.
    func showProgress() async {
        guard isatty(STDERR_FILENO) == 1 else { return }
        var showing = false
        for await status in replica.statusUpdates() {
            switch status {
            case .syncing(let progress?) where progress < 1:
                FileHandle.standardError.write(Data(String(format: "\rcatching up: %3.0f%%", progress * 100).utf8))
                showing = true
            default:
                if showing { FileHandle.standardError.write(Data("\rcatching up: done\n".utf8)) }
                showing = false
            }
        }
    }

    func writeStatus(port: UInt16, started: Date) async {
        let peers = await replica.peers().map { p in
            NodeStatusFile.Peer(
                replicaID: p.info.replicaID.description, deviceID: p.info.deviceID?.humanForm, name: p.info.name,
                address: p.info.address, dialed: p.info.dialed,
                lastConvergedAt: p.lastConvergedAt,
                bytesSent: p.bytesSent, bytesReceived: p.bytesReceived)
        }
        let status = NodeStatusFile(pid: getpid(), listen: "\(configuration.listen?.host ?? "-"):\(port)", insecure: insecure,
                                    startedAt: started, updatedAt: Date(), peers: peers,
                                    health: NodeStatusFile.Health(await replica.syncHealth()),
                                    limits: NodeStatusFile.Limits(configuration), removal: await replica.removal?.description,
                                    relays: await replica.relayStatus().map(NodeStatusFile.RelayEntry.init))
        writeStatusFile(status, to: statusFile)
    }
}
