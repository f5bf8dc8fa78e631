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

/// One DNS-SD reference and the policy operation it carries out. The engine keeps it alive (in
/// `operations`, then in `retired` until deallocated); callbacks find it through the
/// `Unmanaged` context pointer.
final class DNSSDOperation {
    /// Creation order: references are polled, and their callbacks run, in this order.
    let id: Int
    let kind: DiscoveryPolicy.Operation
    var ref: DNSServiceRef?
    /// False once retired: callbacks still queued inside one `DNSServiceProcessResult` are ignored.
    var isActive = true
    weak var engine: DiscoveryEngine?

    init(id: Int, kind: DiscoveryPolicy.Operation, engine: DiscoveryEngine) {
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

    /// Hands `event` to the engine (if the reference is still in use).
    func send(_ event: DiscoveryPolicy.Event) {
        engine?.send(event)
    }

    /// Reports a failure given by a callback's error code (0 with missing data counts as unknown).
    func fail(_ code: DNSServiceErrorType) {
        send(.operationFailed(kind, DNSSDError(code: code == 0 ? DNSSDError.unknown.code : code)))
    }
}

/// The DNS-SD side of one discovery run: it owns the references, drives them with `poll()`,
/// turns callbacks into ``DiscoveryPolicy`` events and carries out the policy's actions. Every
/// decision is the policy's.
///
/// It lives on, and is only ever touched by, the run's thread: it is created there, and DNS-SD
/// calls its callbacks on the thread that calls `DNSServiceProcessResult`, which is that thread.
final class DiscoveryEngine {
    /// Longest single `poll()`: the stop flag is checked at least this often even without a pipe.
    static let longestPoll: Duration = .milliseconds(250)

    private let run: DiscoveryRun
    private let continuation: AsyncStream<DiscoveryEvent>.Continuation
    private let serviceType: String
    private let advertisement: PeerAdvertisement?
    /// The advertisement's TXT record; nil if it cannot be encoded (an entry over 255 bytes).
    private let txtRecord: [UInt8]?
    private var policy: DiscoveryPolicy

    private var operations: [DiscoveryPolicy.Operation: DNSSDOperation] = [:]
    private var retired: [DNSSDOperation] = []
    private var nextOperationID = 0

    init(run: DiscoveryRun, continuation: AsyncStream<DiscoveryEvent>.Continuation, serviceType: String,
         advertisement: PeerAdvertisement?) {
        self.run = run
        self.continuation = continuation
        self.serviceType = serviceType
        self.advertisement = advertisement
        self.txtRecord = advertisement.flatMap { TXTRecord.encode($0.txtEntries) }
        self.policy = DiscoveryPolicy(advertisement: advertisement, startingAt: .now)
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
            send(.tick)
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
                if error != 0, operation.isActive { operation.fail(error) }
            } else {
                // POLLHUP / POLLERR / POLLNVAL without data: the library's side of the socket is gone.
                operation.fail(DNSSDError.unknown.code)
            }
            deallocateRetired()
            if run.stopRequested { return }
        }
    }

    private func timeoutMilliseconds(now: ContinuousClock.Instant) -> Int32 {
        let longest = now + DiscoveryEngine.longestPoll
        let wait = min(longest, policy.nextDeadline ?? longest) - now
        guard wait > .zero else { return 0 }
        let (seconds, attoseconds) = wait.components
        return Int32(seconds * 1_000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000)
    }

    // MARK: - Policy

    /// Hands `event` to the policy and carries out its actions. A reference that cannot be
    /// created becomes the next event (handled after the rest of the current actions).
    fileprivate func send(_ event: DiscoveryPolicy.Event) {
        var events = [event]
        while !events.isEmpty {
            for action in policy.handle(events.removeFirst(), at: .now) {
                if let followUp = perform(action) { events.append(followUp) }
            }
        }
    }

    private func perform(_ action: DiscoveryPolicy.Action) -> DiscoveryPolicy.Event? {
        switch action {
        case .connect:
            return connect()
        case .disconnect:
            for operation in Array(operations.values) { retire(operation) }
        case .startResolve(let key, let interfaceIndex):
            return startResolve(key, interfaceIndex: interfaceIndex)
        case .startAddressQuery(let key, let hostTarget, let interfaceIndex):
            return startAddressQuery(key, hostTarget: hostTarget, interfaceIndex: interfaceIndex)
        case .cancel(let kind):
            if let operation = operations[kind] { retire(operation) }
        case .report(let event):
            continuation.yield(event)
        }
        return nil
    }

    // MARK: - DNS-SD calls

    /// Registers the advertisement (if any) and browses `serviceType`.
    private func connect() -> DiscoveryPolicy.Event? {
        if let advertisement {
            // A TXT entry over 255 bytes (a very long group tag) is a caller error: reported like a
            // failed registration (kDNSServiceErr_BadParam), without asking the daemon.
            guard let txtRecord else { return .operationFailed(.register, .badParam) }
            let failure = start(.register) { ref, context in
                advertisement.serviceName.withCString { name in
                    serviceType.withCString { type in
                        txtRecord.withUnsafeBytes { txt in
                            DNSServiceRegister(
                                &ref, 0, 0, name, type, nil, nil, advertisement.port.bigEndian,
                                UInt16(txt.count), txt.count > 0 ? txt.baseAddress : nil,
                                { _, _, errorCode, name, _, _, context in
                                    guard let operation = DNSSDOperation.from(context) else { return }
                                    guard errorCode == 0 else { return operation.fail(errorCode) }
                                    operation.send(.registered(name: name.map { String(cString: $0) }))
                                },
                                context)
                        }
                    }
                }
            }
            if let failure { return failure }
        }
        let failure = start(.browse) { ref, context in
            serviceType.withCString { type in
                "local.".withCString { domain in
                    DNSServiceBrowse(
                        &ref, 0, 0, type, domain,
                        { _, flags, interfaceIndex, errorCode, name, type, domain, context in
                            guard let operation = DNSSDOperation.from(context) else { return }
                            guard errorCode == 0 else { return operation.fail(errorCode) }
                            guard let name, let type, let domain else { return }
                            let key = ServiceKey(
                                name: String(cString: name), type: String(cString: type), domain: String(cString: domain))
                            operation.send(flags & DNSServiceFlags(kDNSServiceFlagsAdd) != 0
                                ? .browseAdded(key, interfaceIndex: interfaceIndex) : .browseRemoved(key))
                        },
                        context)
                }
            }
        }
        return failure ?? .daemonConnected
    }

    private func startResolve(_ key: ServiceKey, interfaceIndex: UInt32) -> DiscoveryPolicy.Event? {
        start(.resolve(key)) { ref, context in
            key.name.withCString { name in
                key.type.withCString { type in
                    key.domain.withCString { domain in
                        DNSServiceResolve(
                            &ref, 0, interfaceIndex, name, type, domain,
                            { _, _, interfaceIndex, errorCode, _, hostTarget, port, txtLength, txtRecord, context in
                                guard let operation = DNSSDOperation.from(context),
                                      case .resolve(let key) = operation.kind else { return }
                                guard errorCode == 0, let hostTarget else { return operation.fail(errorCode) }
                                let txt = UnsafeRawBufferPointer(
                                    start: txtRecord, count: txtRecord == nil ? 0 : Int(txtLength))
                                operation.send(.resolved(
                                    key, hostTarget: String(cString: hostTarget), interfaceIndex: interfaceIndex,
                                    port: UInt16(bigEndian: port), txt: TXTRecord.decode(txt)))
                            },
                            context)
                    }
                }
            }
        }
    }

    private func startAddressQuery(_ key: ServiceKey, hostTarget: String, interfaceIndex: UInt32)
        -> DiscoveryPolicy.Event?
    {
        start(.addressQuery(key)) { ref, context in
            hostTarget.withCString { host in
                DNSServiceQueryRecord(
                    &ref, 0, interfaceIndex, host, UInt16(kDNSServiceType_A), UInt16(kDNSServiceClass_IN),
                    { _, flags, _, errorCode, _, recordType, _, length, data, _, context in
                        guard let operation = DNSSDOperation.from(context),
                              case .addressQuery(let key) = operation.kind else { return }
                        guard errorCode == 0 else { return operation.fail(errorCode) }
                        // Removals, other record types and malformed data are not an answer.
                        guard flags & DNSServiceFlags(kDNSServiceFlagsAdd) != 0,
                              recordType == UInt16(kDNSServiceType_A), length == 4, let data else { return }
                        let bytes = UnsafeRawBufferPointer(start: data, count: 4)
                        operation.send(.addressResolved(key, ipv4: "\(bytes[0]).\(bytes[1]).\(bytes[2]).\(bytes[3])"))
                    },
                    context)
            }
        }
    }

    // MARK: - References

    /// Creates the reference for `kind` with `call` (a `DNSService…` function given the reference
    /// to fill in and the callback context). Returns nil on success, else the failure event.
    private func start(
        _ kind: DiscoveryPolicy.Operation,
        _ call: (inout DNSServiceRef?, UnsafeMutableRawPointer) -> DNSServiceErrorType
    ) -> DiscoveryPolicy.Event? {
        nextOperationID += 1
        let operation = DNSSDOperation(id: nextOperationID, kind: kind, engine: self)
        var ref: DNSServiceRef?
        let error = call(&ref, operation.context)
        guard error == 0, let ref else {
            return .operationFailed(kind, DNSSDError(code: error == 0 ? DNSSDError.unknown.code : error))
        }
        if let previous = operations[kind] { retire(previous) }
        operation.ref = ref
        operations[kind] = operation
        return nil
    }

    /// Stops using a reference. It is deallocated after the current `DNSServiceProcessResult`
    /// returns (never from inside one of its own callbacks).
    private func retire(_ operation: DNSSDOperation) {
        guard operation.isActive else { return }
        operation.isActive = false
        if operations[operation.kind] === operation { operations[operation.kind] = nil }
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
