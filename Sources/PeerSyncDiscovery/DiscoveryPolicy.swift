@_spi(Engine) import PeerSyncCRDT

/// A browsed service instance: name, type and domain as the browse callback gives them.
struct ServiceKey: Hashable, Comparable {
    let name: String
    let type: String
    let domain: String

    static func < (lhs: ServiceKey, rhs: ServiceKey) -> Bool {
        (lhs.name, lhs.type, lhs.domain) < (rhs.name, rhs.type, rhs.domain)
    }
}

/// What one discovery run decides, with no DNS-SD and no clock: which references to create and
/// drop, which events to report, and when to wake up. ``DiscoveryEngine`` turns DNS-SD callbacks
/// into ``Event``s (each with the monotonic instant it happened at) and carries out the
/// ``Action``s.
///
/// ```
/// disconnected ──tick at reconnect time──▶ connecting ──daemonConnected──▶ connected
///      ▲   (first failure: report unavailable;       │                        │
///      │    retry 0.5 s doubling to 5 s)             │                        │
///      └──────────── register or browse failed ──────┴────────────────────────┘
///
/// per service:  browse add ──▶ resolving (SRV+TXT) ──▶ querying address (A) ──▶ idle, found reported
///                                   └── failure, or 10 s without an answer ──▶ idle, retry 1 s doubling to 30 s
/// ```
///
/// Presence is counted (browse adds minus removes: IPv6 doubles every event), a peer is reported
/// `found` again only if what was found changed, and this node's own advertisement (same replica
/// ID) is never reported. After a daemon outage, peers reported before it that browsing does
/// not report again within ``staleGrace`` of the reconnection are reported lost.
struct DiscoveryPolicy {
    static let firstReconnectDelay: Duration = .milliseconds(500)
    static let longestReconnectDelay: Duration = .seconds(5)
    /// Longest time for one resolution (SRV/TXT, then A record) before it is abandoned and retried.
    static let resolveTimeout: Duration = .seconds(10)
    static let firstResolveRetry: Duration = .seconds(1)
    static let longestResolveRetry: Duration = .seconds(30)
    /// After the daemon comes back, peers reported before the outage that browsing does not
    /// report again within this time are reported lost.
    static let staleGrace: Duration = .seconds(5)

    /// A DNS-SD reference the policy asks for, as the engine keys it.
    enum Operation: Hashable {
        case register
        case browse
        case resolve(ServiceKey)
        case addressQuery(ServiceKey)
    }

    /// What happened, as the engine translates it from DNS-SD.
    enum Event: Equatable {
        /// Time passed: deadlines due at the event's instant fire.
        case tick
        /// The `connect` action succeeded: registration (if advertising) and browsing started.
        case daemonConnected
        /// A reference could not be created, its callback reported an error, or its socket broke.
        case operationFailed(Operation, DNSSDError)
        /// The registration callback confirmed the advertisement, under `name` (nil: as requested).
        case registered(name: String?)
        case browseAdded(ServiceKey, interfaceIndex: UInt32)
        case browseRemoved(ServiceKey)
        /// SRV and TXT of `key`: its host name, and the port in host byte order.
        case resolved(ServiceKey, hostTarget: String, interfaceIndex: UInt32, port: UInt16, txt: [String: String])
        /// The A record of `key`'s host, dotted.
        case addressResolved(ServiceKey, ipv4: String)
    }

    /// What the engine must do, in order.
    enum Action: Equatable {
        /// Register the advertisement (if any) and browse; answer `daemonConnected` or `operationFailed`.
        case connect
        /// Drop every reference (register, browse, resolves, address queries).
        case disconnect
        case startResolve(ServiceKey, interfaceIndex: UInt32)
        case startAddressQuery(ServiceKey, hostTarget: String, interfaceIndex: UInt32)
        /// Drop the reference for `operation`, if there is one.
        case cancel(Operation)
        case report(DiscoveryEvent)
    }

    enum Connection: Equatable {
        case disconnected(reconnectAt: ContinuousClock.Instant)
        case connecting
        case connected
    }

    /// Where the resolution of one service instance stands.
    enum Stage: Equatable {
        case idle
        case resolving
        /// SRV + TXT known, waiting for the A record.
        case queryingAddress(port: UInt16, txt: [String: String])
    }

    /// What the policy knows about one browsed service instance.
    struct Service: Equatable {
        var interfaceIndex: UInt32
        /// Browse adds minus removes (IPv6 doubles every event); the instance is present while > 0.
        var presence = 0
        var stage = Stage.idle
        /// Deadline of the resolution in progress (resolve + address query).
        var attemptDeadline: ContinuousClock.Instant?
        /// When to try again after a failed resolution.
        var retryAt: ContinuousClock.Instant?
        var failures = 0
        /// The peer last reported with `found`.
        var reported: DiscoveredPeer?
        /// This node's own advertisement: never reported.
        var isSelf = false
        /// Reported before an outage and not yet seen again since the daemon came back.
        var isStale = false

        var isResolving: Bool { stage != .idle }
    }

    private(set) var connection: Connection
    private(set) var services: [ServiceKey: Service] = [:]
    private var inOutage = false
    private var registeredName: String?
    private var reconnectDelay = DiscoveryPolicy.firstReconnectDelay
    private var staleDeadline: ContinuousClock.Instant?
    private let ownReplicaID: ReplicaID?
    private let advertisedName: String?

    /// A run advertising `advertisement` (nil: browse only) that connects at its first tick at or after `start`.
    init(advertisement: PeerAdvertisement?, startingAt start: ContinuousClock.Instant) {
        ownReplicaID = advertisement?.replicaID
        advertisedName = advertisement?.serviceName
        connection = .disconnected(reconnectAt: start)
    }

    /// The earliest instant at which a `tick` has something to do; nil if nothing is scheduled.
    var nextDeadline: ContinuousClock.Instant? {
        var deadlines: [ContinuousClock.Instant] = []
        if case .disconnected(let reconnectAt) = connection { deadlines.append(reconnectAt) }
        if let staleDeadline { deadlines.append(staleDeadline) }
        for service in services.values {
            if let attempt = service.attemptDeadline { deadlines.append(attempt) }
            if let retry = service.retryAt { deadlines.append(retry) }
        }
        return deadlines.min()
    }

    /// The delay before the next resolution after `failures` failed ones in a row (1 s doubling to 30 s).
    static func resolveRetryDelay(afterFailures failures: Int) -> Duration {
        min(firstResolveRetry * (1 << min(max(failures, 1) - 1, 5)), longestResolveRetry)
    }

    /// Takes `event`, which happened at `now`, and returns what to do about it.
    mutating func handle(_ event: Event, at now: ContinuousClock.Instant) -> [Action] {
        switch event {
        case .tick:
            return tick(now)
        case .daemonConnected:
            guard connection == .connecting else { return [] }
            connection = .connected
            reconnectDelay = Self.firstReconnectDelay
            if services.values.contains(where: \.isStale) { staleDeadline = now + Self.staleGrace }
            guard inOutage else { return [] }
            inOutage = false
            return [.report(.recovered)]
        case .operationFailed(.register, let error), .operationFailed(.browse, let error):
            if case .disconnected = connection { return [] }  // a late failure of the previous connection
            return enterOutage(error, now: now)
        case .operationFailed(let operation, _):
            // Resolver errors include plain timeouts (the compat layer maps those to
            // kDNSServiceErr_Unknown too), so they only fail this resolution; a dead daemon shows
            // through register/browse.
            let stage = operation.service.flatMap { services[$0]?.stage }
            switch (operation, stage) {
            case (.resolve(let key), .resolving), (.addressQuery(let key), .queryingAddress):
                return resolutionFailed(key, now: now)
            default:
                return [.cancel(operation)]
            }
        case .registered(let name):
            let chosen = name ?? advertisedName ?? ""
            guard chosen != registeredName else { return [] }
            registeredName = chosen
            return [.report(.registered(name: chosen))]
        case .browseAdded(let key, let interfaceIndex):
            var service = services[key] ?? Service(interfaceIndex: interfaceIndex)
            service.presence += 1
            if service.presence == 1 {  // else a double (IPv6) of an instance already present
                service.interfaceIndex = interfaceIndex
                service.isStale = false
                service.failures = 0
                service.retryAt = nil
            }
            services[key] = service
            guard service.presence == 1, !service.isResolving else { return [] }
            return startResolve(key, now: now)
        case .browseRemoved(let key):
            guard var service = services[key] else { return [] }
            service.presence = max(0, service.presence - 1)
            services[key] = service
            return service.presence == 0 ? forget(key) : []
        case .resolved(let key, let hostTarget, let interfaceIndex, let port, let txt):
            guard var service = services[key], service.stage == .resolving else { return [.cancel(.resolve(key))] }
            var actions: [Action] = [.cancel(.resolve(key))]
            if let own = ownReplicaID, txt["id"].flatMap(ReplicaID.init(hex:)) == own {
                service.isSelf = true
                service.stage = .idle
                service.attemptDeadline = nil
            } else {
                service.stage = .queryingAddress(port: port, txt: txt)
                actions.append(.startAddressQuery(key, hostTarget: hostTarget, interfaceIndex: interfaceIndex))
            }
            services[key] = service
            return actions
        case .addressResolved(let key, let ipv4):
            guard var service = services[key], case .queryingAddress(let port, let txt) = service.stage else {
                return [.cancel(.addressQuery(key))]
            }
            var actions: [Action] = [.cancel(.addressQuery(key))]
            service.stage = .idle
            service.attemptDeadline = nil
            service.failures = 0
            let peer = DiscoveredPeer(
                serviceName: key.name, host: ipv4, port: port, replicaID: txt["id"].flatMap(ReplicaID.init(hex:)),
                groupTag: txt["g"], protocolVersion: txt["v"].flatMap { Int($0) })
            if peer != service.reported {
                service.reported = peer
                actions.append(.report(.found(peer)))
            }
            services[key] = service
            return actions
        }
    }

    // MARK: - Steps

    private mutating func tick(_ now: ContinuousClock.Instant) -> [Action] {
        var actions: [Action] = []
        if case .disconnected(let reconnectAt) = connection, now >= reconnectAt {
            connection = .connecting
            actions.append(.connect)
        }
        if let deadline = staleDeadline, now >= deadline {
            staleDeadline = nil
            for key in services.keys.sorted() where services[key]?.isStale == true {
                actions += forget(key)
            }
        }
        for key in services.keys.sorted() {
            if let deadline = services[key]?.attemptDeadline, now >= deadline {
                actions += resolutionFailed(key, now: now)
            }
            guard let service = services[key], let retry = service.retryAt, now >= retry, !service.isResolving else {
                continue
            }
            services[key]?.retryAt = nil
            if service.presence > 0 && connection == .connected { actions += startResolve(key, now: now) }
        }
        return actions
    }

    /// The daemon is unreachable (or registration/browsing broke): drop every reference, report
    /// it once per outage, and schedule a reconnection with backoff. Peers already reported stay
    /// known (stale) so that seeing them again after the outage is not a new `found`.
    private mutating func enterOutage(_ error: DNSSDError, now: ContinuousClock.Instant) -> [Action] {
        var actions: [Action] = [.disconnect]
        registeredName = nil
        staleDeadline = nil
        for (key, service) in services {
            if service.reported != nil && !service.isSelf {
                var stale = Service(interfaceIndex: service.interfaceIndex)
                stale.reported = service.reported
                stale.isStale = true
                services[key] = stale
            } else {
                services[key] = nil
            }
        }
        if !inOutage {
            inOutage = true
            actions.append(.report(.unavailable(error)))
        }
        connection = .disconnected(reconnectAt: now + reconnectDelay)
        reconnectDelay = min(reconnectDelay * 2, Self.longestReconnectDelay)
        return actions
    }

    private mutating func startResolve(_ key: ServiceKey, now: ContinuousClock.Instant) -> [Action] {
        guard let interfaceIndex = services[key]?.interfaceIndex else { return [] }
        services[key]?.stage = .resolving
        services[key]?.attemptDeadline = now + Self.resolveTimeout
        return [.startResolve(key, interfaceIndex: interfaceIndex)]
    }

    /// Abandons the resolution in progress and schedules another while the instance is browsed.
    private mutating func resolutionFailed(_ key: ServiceKey, now: ContinuousClock.Instant) -> [Action] {
        guard var service = services[key] else { return [] }
        let actions = Self.cancellations(key, service.stage)
        service.stage = .idle
        service.attemptDeadline = nil
        service.failures += 1
        service.retryAt = now + Self.resolveRetryDelay(afterFailures: service.failures)
        services[key] = service
        return actions
    }

    /// Drops a service instance; reports it lost if it had been reported found.
    private mutating func forget(_ key: ServiceKey) -> [Action] {
        guard let service = services.removeValue(forKey: key) else { return [] }
        var actions = Self.cancellations(key, service.stage)
        if service.reported != nil, !service.isSelf { actions.append(.report(.lost(serviceName: key.name))) }
        return actions
    }

    private static func cancellations(_ key: ServiceKey, _ stage: Stage) -> [Action] {
        switch stage {
        case .idle: []
        case .resolving: [.cancel(.resolve(key))]
        case .queryingAddress: [.cancel(.addressQuery(key))]
        }
    }
}

extension DiscoveryPolicy.Operation {
    /// The service instance a resolve or address query is for.
    var service: ServiceKey? {
        switch self {
        case .register, .browse: nil
        case .resolve(let key), .addressQuery(let key): key
        }
    }
}
