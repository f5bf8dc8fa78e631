#if canImport(CDNSSD)
import CDNSSD
#elseif canImport(dnssd)
import dnssd
#endif
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import PeerSyncCRDT

/// One DNS-SD reference and what it is for. The engine keeps it alive (in `operations`, then in
/// `retired` until deallocated); callbacks find it through the `Unmanaged` context pointer.
final class DNSSDOperation {
    enum Kind {
        case register
        case browse
        case resolve(ServiceKey)
        case queryAddress(ServiceKey)
    }

    let id: Int
    let kind: Kind
    var ref: DNSServiceRef?
    /// False once retired: callbacks still queued inside one `DNSServiceProcessResult` are ignored.
    var isActive = true
    weak var engine: DiscoveryEngine?

    init(id: Int, kind: Kind, engine: DiscoveryEngine) {
        self.id = id
        self.kind = kind
        self.engine = engine
    }

    var context: UnsafeMutableRawPointer { Unmanaged.passUnretained(self).toOpaque() }

    static func from(_ context: UnsafeMutableRawPointer?) -> DNSSDOperation? {
        guard let context else { return nil }
        let operation = Unmanaged<DNSSDOperation>.fromOpaque(context).takeUnretainedValue()
        return operation.isActive ? operation : nil
    }
}

/// A browsed service instance: name, type and domain as the browse callback gives them.
struct ServiceKey: Hashable {
    let name: String
    let type: String
    let domain: String
}

/// What the engine knows about one browsed service instance.
final class ServiceState {
    let key: ServiceKey
    var interfaceIndex: UInt32
    /// Browse "add"s minus "remove"s (IPv6 doubles every event); the instance is present while > 0.
    var presence = 0
    var resolveOperation: DNSSDOperation?
    var queryOperation: DNSSDOperation?
    /// SRV + TXT of the resolution in progress, waiting for the A record.
    var pendingPort: UInt16 = 0
    var pendingTXT: [String: String] = [:]
    /// Deadline of the resolution in progress (resolve + address query).
    var attemptDeadline: ContinuousClock.Instant?
    /// When to try again after a failed resolution.
    var retryAt: ContinuousClock.Instant?
    var failures = 0
    /// The peer last reported with `.found`.
    var reported: DiscoveredPeer?
    /// This node's own advertisement: never reported.
    var isSelf = false
    /// Reported before an outage and not yet seen again since the daemon came back.
    var isStale = false

    init(key: ServiceKey, interfaceIndex: UInt32) {
        self.key = key
        self.interfaceIndex = interfaceIndex
    }

    var isResolving: Bool { resolveOperation != nil || queryOperation != nil }
}

/// The state machine of one discovery run. It lives on, and is only ever touched by, the run's
/// thread: it is created there, and DNS-SD calls its callbacks on the thread that calls
/// `DNSServiceProcessResult`, which is that thread.
final class DiscoveryEngine {
    static let firstBackoff: Duration = .milliseconds(500)
    static let longestBackoff: Duration = .seconds(5)
    /// Longest time for one resolution (SRV/TXT, then A record) before it is abandoned and retried.
    static let resolveTimeout: Duration = .seconds(10)
    static let longestResolveRetry: Duration = .seconds(30)
    /// After the daemon comes back, peers reported before the outage that browsing does not
    /// report again within this time are reported lost.
    static let staleGrace: Duration = .seconds(5)
    /// Longest single `poll()`: the stop flag is checked at least this often even without a pipe.
    static let longestPoll: Duration = .milliseconds(250)

    private let run: DiscoveryRun
    private let continuation: AsyncStream<DiscoveryEvent>.Continuation
    private let serviceType: String
    private let advertisement: PeerAdvertisement?
    /// The advertisement's TXT record; nil if it cannot be encoded (an entry over 255 bytes).
    private let txtRecord: [UInt8]?

    private var operations: [Int: DNSSDOperation] = [:]
    private var retired: [DNSSDOperation] = []
    private var nextOperationID = 0
    private var services: [ServiceKey: ServiceState] = [:]

    private var isConnected = false
    private var inOutage = false
    private var registeredName: String?
    private var nextConnectAt: ContinuousClock.Instant
    private var backoff = DiscoveryEngine.firstBackoff
    private var staleDeadline: ContinuousClock.Instant?

    init(run: DiscoveryRun, continuation: AsyncStream<DiscoveryEvent>.Continuation, serviceType: String,
         advertisement: PeerAdvertisement?) {
        self.run = run
        self.continuation = continuation
        self.serviceType = serviceType
        self.advertisement = advertisement
        self.txtRecord = advertisement.flatMap { TXTRecord.encode($0.txtEntries) }
        self.nextConnectAt = .now
    }

    // MARK: - Loop

    func runLoop() {
        defer {
            for operation in Array(operations.values) { retire(operation) }
            deallocateRetired()
            continuation.finish()
            run.markExited()
        }
        while !run.stopRequested {
            let now = ContinuousClock.now
            if !isConnected && now >= nextConnectAt { connect() }
            runTimers(now: .now)
            deallocateRetired()
            if run.stopRequested { break }
            pollOnce()
        }
    }

    private func pollOnce() {
        var descriptors = [pollfd(fd: run.wakeReadFD, events: Int16(POLLIN), revents: 0)]
        var polled: [DNSSDOperation] = []
        for operation in operations.values.sorted(by: { $0.id < $1.id }) {
            guard let ref = operation.ref else { continue }
            let fd = DNSServiceRefSockFD(ref)
            guard fd >= 0 else { continue }
            descriptors.append(pollfd(fd: fd, events: Int16(POLLIN), revents: 0))
            polled.append(operation)
        }
        let ready = poll(&descriptors, nfds_t(descriptors.count), timeoutMilliseconds(now: .now))
        guard ready > 0 else { return }  // timeout, or EINTR: the loop comes round again
        if descriptors[0].revents != 0 { run.drainWakeups() }
        for (index, operation) in polled.enumerated() {
            let revents = descriptors[index + 1].revents
            guard revents != 0, operation.isActive, let ref = operation.ref else { continue }
            if revents & Int16(POLLIN) != 0 {
                let error = DNSServiceProcessResult(ref)
                if error != 0, operation.isActive { operationFailed(operation, DNSSDError(code: error)) }
            } else {
                // POLLHUP / POLLERR / POLLNVAL without data: the library's side of the socket is gone.
                operationFailed(operation, .unknown)
            }
            deallocateRetired()
            if run.stopRequested { return }
        }
    }

    private func timeoutMilliseconds(now: ContinuousClock.Instant) -> Int32 {
        var deadline = now + DiscoveryEngine.longestPoll
        if !isConnected { deadline = min(deadline, nextConnectAt) }
        if let staleDeadline { deadline = min(deadline, staleDeadline) }
        for service in services.values {
            if let attempt = service.attemptDeadline { deadline = min(deadline, attempt) }
            if let retry = service.retryAt { deadline = min(deadline, retry) }
        }
        let wait = deadline - now
        guard wait > .zero else { return 0 }
        let (seconds, attoseconds) = wait.components
        return Int32(seconds * 1_000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000)
    }

    private func runTimers(now: ContinuousClock.Instant) {
        if let deadline = staleDeadline, now >= deadline {
            staleDeadline = nil
            for service in Array(services.values) where service.isStale {
                forget(service, reportLost: true)
            }
        }
        for service in Array(services.values) {
            if let deadline = service.attemptDeadline, now >= deadline {
                resolutionFailed(service)
            }
            if let retry = service.retryAt, now >= retry, !service.isResolving {
                service.retryAt = nil
                if service.presence > 0 && isConnected { startResolve(service) }
            }
        }
    }

    // MARK: - Connection and outages

    private func connect() {
        if let advertisement {
            // A TXT entry over 255 bytes (a very long group tag) is a caller error: reported like a
            // failed registration (kDNSServiceErr_BadParam), without asking the daemon.
            guard let txtRecord else {
                connectFailed(.badParam)
                return
            }
            let operation = makeOperation(.register)
            var ref: DNSServiceRef?
            let error = advertisement.serviceName.withCString { name in
                serviceType.withCString { type in
                    txtRecord.withUnsafeBytes { txt in
                        DNSServiceRegister(
                            &ref, 0, 0, name, type, nil, nil, advertisement.port.bigEndian,
                            UInt16(txt.count), txt.count > 0 ? txt.baseAddress : nil,
                            { _, _, errorCode, name, _, _, context in
                                guard let operation = DNSSDOperation.from(context) else { return }
                                operation.engine?.registerReply(
                                    operation, error: errorCode, name: name.map { String(cString: $0) })
                            },
                            operation.context)
                    }
                }
            }
            guard error == 0, let ref else {
                connectFailed(DNSSDError(code: error == 0 ? DNSSDError.unknown.code : error))
                return
            }
            activate(operation, ref: ref)
        }

        let operation = makeOperation(.browse)
        var ref: DNSServiceRef?
        let error = serviceType.withCString { type in
            "local.".withCString { domain in
                DNSServiceBrowse(
                    &ref, 0, 0, type, domain,
                    { _, flags, interfaceIndex, errorCode, name, type, domain, context in
                        guard let operation = DNSSDOperation.from(context) else { return }
                        operation.engine?.browseReply(
                            operation, flags: flags, interfaceIndex: interfaceIndex, error: errorCode,
                            name: name.map { String(cString: $0) }, type: type.map { String(cString: $0) },
                            domain: domain.map { String(cString: $0) })
                    },
                    operation.context)
            }
        }
        guard error == 0, let ref else {
            connectFailed(DNSSDError(code: error == 0 ? DNSSDError.unknown.code : error))
            return
        }
        activate(operation, ref: ref)

        isConnected = true
        backoff = DiscoveryEngine.firstBackoff
        if inOutage {
            inOutage = false
            continuation.yield(.recovered)
        }
        if services.values.contains(where: \.isStale) {
            staleDeadline = .now + DiscoveryEngine.staleGrace
        }
    }

    private func connectFailed(_ error: DNSSDError) {
        enterOutage(error)
    }

    /// The daemon is unreachable (or registration/browsing broke): drop every reference, report it
    /// once, and schedule a reconnection with backoff.
    private func enterOutage(_ error: DNSSDError) {
        for operation in Array(operations.values) { retire(operation) }
        isConnected = false
        registeredName = nil
        staleDeadline = nil
        for service in Array(services.values) {
            service.resolveOperation = nil
            service.queryOperation = nil
            service.attemptDeadline = nil
            service.retryAt = nil
            service.failures = 0
            service.presence = 0
            if service.reported != nil && !service.isSelf {
                service.isStale = true
            } else {
                services[service.key] = nil
            }
        }
        if !inOutage {
            inOutage = true
            continuation.yield(.unavailable(error))
        }
        nextConnectAt = .now + backoff
        backoff = min(backoff * 2, DiscoveryEngine.longestBackoff)
    }

    private func operationFailed(_ operation: DNSSDOperation, _ error: DNSSDError) {
        switch operation.kind {
        case .register, .browse:
            enterOutage(error)
        case .resolve(let key), .queryAddress(let key):
            // Resolver errors include plain timeouts (also mapped to kDNSServiceErr_Unknown), so they
            // only fail this resolution; a dead daemon is reported through register/browse.
            if let service = services[key] { resolutionFailed(service) } else { retire(operation) }
        }
    }

    // MARK: - Callbacks

    fileprivate func registerReply(_ operation: DNSSDOperation, error: DNSServiceErrorType, name: String?) {
        guard error == 0 else {
            enterOutage(DNSSDError(code: error))
            return
        }
        let chosen = name ?? advertisement?.serviceName ?? ""
        if chosen != registeredName {
            registeredName = chosen
            continuation.yield(.registered(name: chosen))
        }
    }

    fileprivate func browseReply(_ operation: DNSSDOperation, flags: DNSServiceFlags, interfaceIndex: UInt32,
                                 error: DNSServiceErrorType, name: String?, type: String?, domain: String?) {
        guard error == 0 else {
            enterOutage(DNSSDError(code: error))
            return
        }
        guard let name, let type, let domain else { return }
        let key = ServiceKey(name: name, type: type, domain: domain)
        if flags & DNSServiceFlags(kDNSServiceFlagsAdd) != 0 {
            let service = services[key] ?? ServiceState(key: key, interfaceIndex: interfaceIndex)
            services[key] = service
            service.presence += 1
            guard service.presence == 1 else { return }  // a double (IPv6) of an instance already present
            service.interfaceIndex = interfaceIndex
            service.isStale = false
            service.failures = 0
            service.retryAt = nil
            if !service.isResolving { startResolve(service) }
        } else {
            guard let service = services[key] else { return }
            service.presence = max(0, service.presence - 1)
            if service.presence == 0 { forget(service, reportLost: true) }
        }
    }

    fileprivate func resolveReply(_ operation: DNSSDOperation, interfaceIndex: UInt32, error: DNSServiceErrorType,
                                  hostTarget: String?, port: UInt16, txt: UnsafeRawBufferPointer) {
        guard case .resolve(let key) = operation.kind, let service = services[key],
              service.resolveOperation === operation else {
            retire(operation)
            return
        }
        guard error == 0, let hostTarget else {
            resolutionFailed(service)
            return
        }
        retire(operation)
        service.resolveOperation = nil
        service.pendingPort = UInt16(bigEndian: port)
        service.pendingTXT = TXTRecord.decode(txt)
        if let own = advertisement?.replicaID, service.pendingTXT["id"].flatMap(ReplicaID.init(hex:)) == own {
            service.isSelf = true
            service.attemptDeadline = nil
            return
        }
        startAddressQuery(service, hostTarget: hostTarget, interfaceIndex: interfaceIndex)
    }

    fileprivate func queryReply(_ operation: DNSSDOperation, flags: DNSServiceFlags, error: DNSServiceErrorType,
                                recordType: UInt16, data: UnsafeRawBufferPointer) {
        guard case .queryAddress(let key) = operation.kind, let service = services[key],
              service.queryOperation === operation else {
            retire(operation)
            return
        }
        guard error == 0 else {
            resolutionFailed(service)
            return
        }
        guard flags & DNSServiceFlags(kDNSServiceFlagsAdd) != 0,
              recordType == UInt16(kDNSServiceType_A), data.count == 4 else { return }
        retire(operation)
        service.queryOperation = nil
        service.attemptDeadline = nil
        service.failures = 0
        let host = "\(data[0]).\(data[1]).\(data[2]).\(data[3])"
        let txt = service.pendingTXT
        let peer = DiscoveredPeer(
            serviceName: service.key.name, host: host, port: service.pendingPort,
            replicaID: txt["id"].flatMap(ReplicaID.init(hex:)), groupTag: txt["g"],
            protocolVersion: txt["v"].flatMap { Int($0) })
        if peer != service.reported {
            service.reported = peer
            continuation.yield(.found(peer))
        }
    }

    // MARK: - Resolution

    private func startResolve(_ service: ServiceState) {
        let operation = makeOperation(.resolve(service.key))
        var ref: DNSServiceRef?
        let key = service.key
        let error = key.name.withCString { name in
            key.type.withCString { type in
                key.domain.withCString { domain in
                    DNSServiceResolve(
                        &ref, 0, service.interfaceIndex, name, type, domain,
                        { _, _, interfaceIndex, errorCode, _, hostTarget, port, txtLength, txtRecord, context in
                            guard let operation = DNSSDOperation.from(context) else { return }
                            let txt = UnsafeRawBufferPointer(
                                start: txtRecord, count: txtRecord == nil ? 0 : Int(txtLength))
                            operation.engine?.resolveReply(
                                operation, interfaceIndex: interfaceIndex, error: errorCode,
                                hostTarget: hostTarget.map { String(cString: $0) }, port: port, txt: txt)
                        },
                        operation.context)
                }
            }
        }
        service.attemptDeadline = .now + DiscoveryEngine.resolveTimeout
        guard error == 0, let ref else {
            resolutionFailed(service)
            return
        }
        activate(operation, ref: ref)
        service.resolveOperation = operation
    }

    private func startAddressQuery(_ service: ServiceState, hostTarget: String, interfaceIndex: UInt32) {
        let operation = makeOperation(.queryAddress(service.key))
        var ref: DNSServiceRef?
        let error = hostTarget.withCString { host in
            DNSServiceQueryRecord(
                &ref, 0, interfaceIndex, host, UInt16(kDNSServiceType_A), UInt16(kDNSServiceClass_IN),
                { _, flags, _, errorCode, _, recordType, _, length, data, _, context in
                    guard let operation = DNSSDOperation.from(context) else { return }
                    let bytes = UnsafeRawBufferPointer(start: data, count: data == nil ? 0 : Int(length))
                    operation.engine?.queryReply(
                        operation, flags: flags, error: errorCode, recordType: recordType, data: bytes)
                },
                operation.context)
        }
        guard error == 0, let ref else {
            resolutionFailed(service)
            return
        }
        activate(operation, ref: ref)
        service.queryOperation = operation
    }

    /// Abandons the resolution in progress and schedules another (1 s doubling to 30 s) while the
    /// instance is still being browsed.
    private func resolutionFailed(_ service: ServiceState) {
        if let operation = service.resolveOperation { retire(operation) }
        if let operation = service.queryOperation { retire(operation) }
        service.resolveOperation = nil
        service.queryOperation = nil
        service.attemptDeadline = nil
        service.failures += 1
        let delay = min(Duration.seconds(1) * (1 << min(service.failures - 1, 5)), DiscoveryEngine.longestResolveRetry)
        service.retryAt = .now + delay
    }

    /// Drops a service instance; reports it lost if it had been reported found.
    private func forget(_ service: ServiceState, reportLost: Bool) {
        if let operation = service.resolveOperation { retire(operation) }
        if let operation = service.queryOperation { retire(operation) }
        services[service.key] = nil
        if reportLost, service.reported != nil, !service.isSelf {
            continuation.yield(.lost(serviceName: service.key.name))
        }
    }

    // MARK: - References

    private func makeOperation(_ kind: DNSSDOperation.Kind) -> DNSSDOperation {
        nextOperationID += 1
        return DNSSDOperation(id: nextOperationID, kind: kind, engine: self)
    }

    private func activate(_ operation: DNSSDOperation, ref: DNSServiceRef) {
        operation.ref = ref
        operations[operation.id] = operation
    }

    /// Stops using a reference. It is deallocated after the current `DNSServiceProcessResult`
    /// returns (never from inside one of its own callbacks).
    private func retire(_ operation: DNSSDOperation) {
        guard operation.isActive else { return }
        operation.isActive = false
        operations[operation.id] = nil
        if operation.ref != nil { retired.append(operation) }
    }

    private func deallocateRetired() {
        let batch = retired
        retired.removeAll()
        for operation in batch {
            if let ref = operation.ref { DNSServiceRefDeallocate(ref) }
            operation.ref = nil
        }
    }
}
