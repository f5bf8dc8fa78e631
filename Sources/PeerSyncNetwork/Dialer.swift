import PeerSyncReplication
import Logging
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity

/// Carries out a node's ``DialScheduler``: starts the attempts it decides on, sleeps until the
/// next one is due (or an attempt ends), and reports how each attempt ended. The attempt itself
/// — connect, TLS, the session until it ends — is the node's (`attempt`).
actor Dialer {
    /// What one attempt ran to: why its session ended, whether it was established, how long it
    /// lasted once established.
    struct Result: Sendable {
        var reason: SessionEndReason
        var established: Bool
        var lasted: Duration
        /// The replica at the other end, once its hello arrived, and its device once authenticated.
        var peer: ReplicaID?
        var peerDevice: DeviceID?
    }

    typealias Attempt = @Sendable (PeerAddress, _ established: @escaping @Sendable () -> Void) async -> Result?

    private var scheduler: DialScheduler
    private var attempt: Attempt?
    private var loop: Task<Void, Never>?
    private var running: [PeerAddress: Task<Void, Never>] = [:]
    private var waiter: CheckedContinuation<Void, Never>?
    private var wakePending = false
    private var stopped = false
    /// Replica IDs of removed devices whose adverts were already said to be left alone.
    private var ignoredRemoved: Set<ReplicaID> = []
    private let logger: Logger

    init(settings: DialScheduler.Settings, logger: Logger) {
        scheduler = DialScheduler(settings: settings)
        self.logger = logger
    }

    /// Starts dialing with `attempt`, which runs one attempt; it returns nil when it made none
    /// (a session with the peer runs the other way round). Later calls change nothing.
    func start(_ attempt: @escaping Attempt) {
        guard self.attempt == nil, !stopped else { return }
        self.attempt = attempt
        loop = Task { await self.run() }
    }

    /// Dials `address` for `source` (an advert naming `replica`) from now on, unless a removed
    /// device is there (said once per replica ID; an address was said when it was given up).
    func add(_ address: PeerAddress, source: DialScheduler.Source, replica: ReplicaID? = nil) {
        guard !stopped else { return }
        if scheduler.add(address, source: source, replica: replica, now: .now) {
            wake()
        } else if let replica, ignoredRemoved.insert(replica).inserted {
            logger.info("not dialing a removed device", metadata: ["peer.address": "\(address)", "peer.id": "\(replica.shortDescription)"])
        }
    }

    /// The removed devices and the replica IDs they claimed, after every roster change.
    func setRemoved(replicas: Set<ReplicaID>, devices: Set<DeviceID>) {
        for address in scheduler.setRemoved(replicas: replicas, devices: devices) {
            logger.info("not dialing a removed device again", metadata: ["peer.address": "\(address)"])
        }
    }

    /// `source` is gone: its addresses are dropped once their attempts end.
    func remove(_ source: DialScheduler.Source) {
        scheduler.remove(source)
    }

    /// The dialing now, for status.
    func status() -> (targets: Int, dialing: Int, peak: Int, rejected: Int, attempts: Int) {
        (scheduler.targets.count, scheduler.dialing, scheduler.peak, scheduler.rejectedTargets, scheduler.attempts)
    }

    /// Starts no attempt from now on.
    func stop() {
        stopped = true
        loop?.cancel()
        wake()
    }

    /// Waits for every attempt to end (their sessions must have been closed).
    func finish() async {
        await loop?.value
        while let (_, task) = running.first {
            await task.value
        }
    }

    private func run() async {
        while !stopped {
            for address in scheduler.due(now: .now) {
                running[address] = Task { await self.dial(address) }
            }
            await sleep(until: scheduler.nextWakeup())
        }
    }

    private func dial(_ address: PeerAddress) async {
        let result = await attempt?(address) { [weak self] in
            Task { await self?.established(address) }
        }
        let outcome = result.map { DialScheduler.Outcome(reason: $0.reason, established: $0.established, lasted: $0.lasted) }
            ?? .connectedElsewhere
        let now = ContinuousClock.now
        if let peer = result?.peer { scheduler.learned(peer, device: result?.peerDevice, at: address) }
        let givenUp = scheduler.ended(address, outcome, now: now, jitter: .random(in: -1...1))
        if outcome == .rejected || outcome == .refusedByPeer, let target = scheduler.targets[address],
           case .waiting(let until) = target.phase {
            // The first refusal in a row at info, the next ones at debug (the backoff spaces them).
            logger.log(level: target.rejections == 1 ? .info : .debug, "dialed peer refused or failed to authenticate; redialing later",
                       metadata: ["peer.address": "\(address)", "dial.refusals": "\(target.rejections)",
                                  "dial.retryInSeconds": "\((until - now).components.seconds)"])
        } else if givenUp {
            logger.info("not dialing a removed device again", metadata: ["peer.address": "\(address)", "reason": "\(result?.reason.description ?? "")"])
        }
        running[address] = nil
        wake()
    }

    private func established(_ address: PeerAddress) {
        scheduler.established(address)
        wake()
    }

    private func wake() {
        if let waiter {
            self.waiter = nil
            waiter.resume()
        } else {
            wakePending = true
        }
    }

    /// Returns at `deadline` (never, for nil) or at the next ``wake()``, whichever is first.
    private func sleep(until deadline: ContinuousClock.Instant?) async {
        if wakePending || stopped {
            wakePending = false
            return
        }
        let timer = deadline.map { deadline in
            Task { [weak self] in
                guard (try? await Task.sleep(until: deadline, clock: .continuous)) != nil else { return }
                await self?.wake()
            }
        }
        await withCheckedContinuation { waiter = $0 }
        timer?.cancel()
    }
}
