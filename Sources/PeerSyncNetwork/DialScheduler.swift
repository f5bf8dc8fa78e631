import PeerSyncReplication
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncWire

/// Which addresses a node dials, and when, with no sockets and no clock. Addresses come from the
/// configuration (static peers) and from discovery; the shell reports each attempt's end, and
/// the scheduler answers with the attempts to start now and the instant to ask again.
///
/// - At most ``SyncLimits/concurrentDials`` attempts run at once, and at most
///   ``SyncLimits/concurrentDialsPerHost`` to one host. An attempt holds its slot from connect
///   until its session is established (or fails); an established session holds none.
/// - Static peers go first, then addresses that have had a session before, then those refused
///   least often, then those on hosts refused least often (so once a forged advert was refused,
///   the others on its host wait behind a real peer found after them), then the longest waiting.
/// - An ordinary failure (unreachable, connection lost) redials with
///   ``SyncTiming/reconnectBackoff``; a session that lasted ``Settings/stableSession`` resets it.
/// - A *discovered* address that never had a session and does not answer (a closed port, no
///   host there) may be a forged advert as much as one that fails authentication, so its
///   backoff grows as far (``Settings/unanswered``): from the ordinary first step — a real
///   advert seen a moment before its listener answers is still retried within a second — doubling
///   on past the ordinary maximum up to the rejected one (5 min), and it is remembered across a
///   withdrawal like a refusal. Configured peers, and addresses that once had a session, keep
///   the ordinary backoff.
/// - A session that fails to authenticate or is refused (``Outcome/rejected``) redials with
///   ``SyncLimits/rejectedDialBackoff``, growing to minutes: 100 forged adverts cost a few
///   attempts a minute, and cannot take the slots a real peer needs. A configured peer is
///   retried within the ordinary backoff then (a slow machine's handshake timeout), unless the
///   peer itself refused this node at admission (``Outcome/refusedByPeer``: a used or expired
///   invite, this device removed, another group or version), which asking again every few
///   seconds does not change.
/// - A peer this node refuses because the roster says its device was removed
///   (``Outcome/removedDevice``) is not dialed again at that address while the node runs (the
///   last ``rememberedLimit`` such addresses are kept), and an address where a removed device
///   is (``setRemoved(replicas:devices:)``: a replica ID it claimed, from its advert or a
///   session there, or its device, from a session there) is not dialed at all. A static peer
///   is an address: which device is behind it is known only once a session reached it (by its
///   device key, even if its replica's claim never reached this node).
/// - An address found again keeps its backoff, also after it was withdrawn (``remove(_:)``
///   drops it once its attempt or session ends; the last ``rememberedLimit`` refused addresses
///   are remembered), so re-announcing a forged advert does not buy it an early attempt.
struct DialScheduler {
    struct Settings: Equatable {
        var concurrent: Int
        var perHost: Int
        var reconnect: Backoff
        var rejected: Backoff
        /// Discovered addresses that never had a session and do not answer: the ordinary first
        /// step, growing to the rejected maximum.
        var unanswered: Backoff
        /// A session that lasted this long resets the backoff.
        var stableSession: Duration = .seconds(10)

        init(limits: SyncLimits, timing: SyncTiming) {
            concurrent = max(1, limits.concurrentDials)
            perHost = max(1, limits.concurrentDialsPerHost)
            reconnect = timing.reconnectBackoff
            rejected = limits.rejectedDialBackoff
            unanswered = Backoff(first: reconnect.first, max: Swift.max(reconnect.max, rejected.max), jitter: reconnect.jitter)
        }
    }

    /// Where an address to dial came from.
    enum Source: Hashable, Sendable {
        /// ``SyncConfiguration/peers`` or ``SyncNode/addPeer(_:)``: dialed until the node stops.
        case configured
        /// A DNS-SD service instance, by name: dialed until it is withdrawn.
        case discovered(serviceName: String)
    }

    /// How an attempt ended.
    enum Outcome: Equatable {
        /// A session was established and ran for `lasted`.
        case established(lasted: Duration)
        /// No connection, or it was lost before a session was established.
        case failed
        /// The session failed to authenticate or was refused (see ``SyncLimits/rejectedDialBackoff``).
        case rejected
        /// The peer refused this node at admission (not admitted, removed, another protocol
        /// version): redialed with ``SyncLimits/rejectedDialBackoff``, a configured peer too.
        case refusedByPeer
        /// This node refused the peer: the roster says its device was removed. Not dialed again.
        case removedDevice
        /// A session with this peer runs the other way round (or this one was the duplicate).
        case connectedElsewhere
        /// The node is stopping.
        case stopped

        /// Classifies why a dialed session ended; `established` says whether it got that far.
        init(reason: SessionEndReason, established: Bool, lasted: Duration) {
            switch reason {
            case .localShutdown:
                self = .stopped
            case .duplicate, .peerClosed(.duplicateConnection, _):
                self = .connectedElsewhere
            case .handshakeFailed:
                self = .rejected
            case .peerClosed(.notAdmitted, _), .peerClosed(.deviceRemoved, _), .peerClosed(.protocolVersion, _):
                self = .refusedByPeer
            case .refused(.deviceRemoved, _):
                self = .removedDevice
            case .refused(let close, _), .peerClosed(let close, _):
                self = Self.isRejection(close, established: established) ? .rejected
                    : established ? .established(lasted: lasted) : .failed
            case .unreachable, .connectionLost, .storageFailed:
                self = established ? .established(lasted: lasted) : .failed
            }
        }

        /// Whether closing with `reason` says the peer is not, or does not take us for, a member
        /// of the group (or does not speak its protocol).
        static func isRejection(_ reason: CloseReason, established: Bool) -> Bool {
            switch reason {
            case .notAdmitted, .deviceRemoved, .protocolVersion, .sameReplica, .clockSkew, .malformed, .frameTooLarge,
                 .unknownMessage, .unclaimedReplica, .forgedReport:
                true
            case .timeout:
                !established  // no hello, or no admission, within the handshake timeout
            case .normal, .duplicateConnection, .shuttingDown, .overloaded, .replicaRestored, .other:
                false
            }
        }
    }

    enum Phase: Equatable {
        case waiting(until: MonotonicInstant)
        /// An attempt runs and holds a slot.
        case dialing
        /// Its session is established; the attempt holds no slot until it ends.
        case connected
    }

    struct Target: Equatable {
        let address: PeerAddress
        var sources: Set<Source>
        var phase: Phase
        /// Consecutive ordinary failures (and sessions shorter than ``Settings/stableSession``).
        var failures = 0
        /// Consecutive rejections.
        var rejections = 0
        var everEstablished = false
        /// The replica there, as its advert or a session there named it.
        var replica: ReplicaID?
        /// The device there, as a session there authenticated it.
        var device: DeviceID?
        /// Arrival order, for ties.
        let order: UInt64

        /// A discovered address that never had a session and failed: ``Settings/unanswered`` applies.
        var isUnanswered: Bool { !everEstablished && failures > 0 && !sources.contains(.configured) }
    }

    let settings: Settings
    private(set) var targets: [PeerAddress: Target] = [:]
    private var nextOrder: UInt64 = 0
    /// Rejections of any address on a host since a session with it was last established.
    private(set) var hostRejections: [String: Int] = [:]
    /// Dropped addresses that had been refused, or never answered: their rejections, failures
    /// and the end of their backoff.
    private var remembered: [PeerAddress: (rejections: Int, failures: Int, until: MonotonicInstant)] = [:]
    static let rememberedLimit = 1_024
    /// Addresses where this node refused a removed device (``Outcome/removedDevice``), with the
    /// order they were found in (the oldest is forgotten beyond ``rememberedLimit``).
    private(set) var removedAddresses: [PeerAddress: UInt64] = [:]
    /// Removed devices, and the replica IDs they claimed (the roster's, from ``setRemoved(replicas:devices:)``).
    private(set) var removedDevices: Set<DeviceID> = []
    /// Replica IDs claimed by removed devices (the roster's, from ``setRemoved(replicas:devices:)``).
    private(set) var removedReplicas: Set<ReplicaID> = []
    /// Attempts started so far.
    private(set) var attempts = 0
    /// The most attempts that ran at once.
    private(set) var peak = 0

    init(settings: Settings) {
        self.settings = settings
    }

    /// Attempts holding a slot now.
    var dialing: Int { targets.values.count { $0.phase == .dialing } }

    /// Addresses waiting out ``SyncLimits/rejectedDialBackoff``.
    var rejectedTargets: Int { targets.values.count { $0.rejections > 0 } }

    /// Dial `address` (for `source`; `replica`: the one its advert names). A new address is due
    /// at once; a known one keeps its state (finding a forged advert again does not reset its
    /// backoff). A discovered service found at another address leaves its old one. Returns false
    /// if a removed device is there, so the address is not dialed: `replica` is one a removed
    /// device claimed, or (no other replica named) this node refused a removed device there.
    @discardableResult
    mutating func add(_ address: PeerAddress, source: Source, replica: ReplicaID? = nil, now: MonotonicInstant) -> Bool {
        if let replica, removedReplicas.contains(replica) { return false }
        if removedAddresses[address] != nil {
            // An advert naming a replica no removed device claimed: another device is there now.
            guard replica != nil else { return false }
            removedAddresses[address] = nil
        }
        if case .discovered = source { detach(source, except: address) }
        if targets[address] != nil {
            targets[address]!.sources.insert(source)
            if let replica { targets[address]!.replica = replica }
            return true
        }
        let past = remembered.removeValue(forKey: address)
        targets[address] = Target(address: address, sources: [source], phase: .waiting(until: max(now, past?.until ?? now)),
                                  failures: past?.failures ?? 0, rejections: past?.rejections ?? 0, replica: replica,
                                  order: nextOrder)
        nextOrder += 1
        return true
    }

    /// The removed devices and the replica IDs they claimed (the roster's, after every change):
    /// a target waiting to dial one of them is dropped, and an advert naming one is not dialed.
    /// Returns the addresses dropped now (one dialing or connected ends when the node refuses it).
    mutating func setRemoved(replicas: Set<ReplicaID>, devices: Set<DeviceID>) -> [PeerAddress] {
        removedReplicas = replicas
        removedDevices = devices
        let dropped = targets.values.filter { target in
            guard isRemoved(target), case .waiting = target.phase else { return false }
            return true
        }.map(\.address).sorted { $0.description < $1.description }
        for address in dropped {
            targets[address] = nil
            if !targets.keys.contains(where: { $0.host == address.host }) { hostRejections[address.host] = nil }
        }
        return dropped
    }

    /// A session showed that `replica` of `device` is at `address` (should that device be
    /// removed, the address is not dialed again).
    mutating func learned(_ replica: ReplicaID, device: DeviceID?, at address: PeerAddress) {
        targets[address]?.replica = replica
        if let device { targets[address]?.device = device }
    }

    private func isRemoved(_ target: Target) -> Bool {
        target.replica.map(removedReplicas.contains) == true || target.device.map(removedDevices.contains) == true
    }

    /// `source` is gone (a withdrawn advert): its addresses are no longer dialed once their
    /// attempt or session ends.
    mutating func remove(_ source: Source) {
        detach(source, except: nil)
    }

    private mutating func detach(_ source: Source, except kept: PeerAddress?) {
        for address in Array(targets.keys) where address != kept {
            guard targets[address]!.sources.remove(source) != nil, targets[address]!.sources.isEmpty else { continue }
            if case .waiting = targets[address]!.phase { drop(address) }
        }
    }

    /// Forgets `address`, and its host's rejections once no address on it is left. An address
    /// that was refused, or never answered, is remembered with its backoff.
    private mutating func drop(_ address: PeerAddress) {
        if let target = targets.removeValue(forKey: address), target.rejections > 0 || target.isUnanswered,
           case .waiting(let until) = target.phase {
            if remembered.count >= Self.rememberedLimit, let oldest = remembered.min(by: { $0.value.until < $1.value.until }) {
                remembered[oldest.key] = nil
            }
            remembered[address] = (target.rejections, target.isUnanswered ? target.failures : 0, until)
        }
        if !targets.keys.contains(where: { $0.host == address.host }) { hostRejections[address.host] = nil }
    }

    /// Attempts to start now, in order; each now holds a slot until ``established(_:)`` or
    /// ``ended(_:_:now:jitter:)``.
    mutating func due(now: MonotonicInstant) -> [PeerAddress] {
        var running = dialing
        guard running < settings.concurrent else { return [] }
        var perHost: [String: Int] = [:]
        for target in targets.values where target.phase == .dialing { perHost[target.address.host, default: 0] += 1 }
        let candidates = targets.values.filter { target in
            if case .waiting(let until) = target.phase { return until <= now }
            return false
        }.sorted(by: precedes)
        var started: [PeerAddress] = []
        for target in candidates where running < settings.concurrent {
            guard perHost[target.address.host, default: 0] < settings.perHost else { continue }
            perHost[target.address.host, default: 0] += 1
            running += 1
            targets[target.address]!.phase = .dialing
            started.append(target.address)
        }
        attempts += started.count
        peak = max(peak, running)
        return started
    }

    /// Whether `a` is dialed before `b` when both are due.
    private func precedes(_ a: Target, _ b: Target) -> Bool {
        let aConfigured = a.sources.contains(.configured), bConfigured = b.sources.contains(.configured)
        if aConfigured != bConfigured { return aConfigured }
        if a.everEstablished != b.everEstablished { return a.everEstablished }
        if a.rejections != b.rejections { return a.rejections < b.rejections }
        let (aHost, bHost) = (hostRejections[a.address.host, default: 0], hostRejections[b.address.host, default: 0])
        if aHost != bHost { return aHost < bHost }
        if case .waiting(let x) = a.phase, case .waiting(let y) = b.phase, x != y { return x < y }
        return a.order < b.order
    }

    /// The attempt to `address` established its session: its slot is free.
    mutating func established(_ address: PeerAddress) {
        guard targets[address]?.phase == .dialing else { return }
        targets[address]!.phase = .connected
        targets[address]!.everEstablished = true
    }

    /// The attempt to `address` ended (its session, if any, too). `jitter` is a random number in
    /// `-1...1`. Returns true if the address is not dialed again because a removed device is there.
    @discardableResult
    mutating func ended(_ address: PeerAddress, _ outcome: Outcome, now: MonotonicInstant, jitter: Double) -> Bool {
        guard var target = targets[address] else { return false }
        // The roster removed the device there while this attempt ran.
        let removed = outcome != .stopped && isRemoved(target)
        let delay: Duration
        switch removed ? .removedDevice : outcome {
        case .established(let lasted):
            target.everEstablished = true
            target.rejections = 0
            hostRejections[address.host] = nil
            target.failures = lasted >= settings.stableSession ? 0 : target.failures + 1
            delay = settings.reconnect.delay(afterFailures: target.failures - 1, unit: jitter)
        case .failed:
            target.failures += 1
            delay = (target.isUnanswered ? settings.unanswered : settings.reconnect).delay(afterFailures: target.failures - 1, unit: jitter)
        case .rejected, .refusedByPeer:
            target.rejections += 1
            hostRejections[address.host, default: 0] += 1
            // A peer the user configured is not a forged advert: a handshake that timed out (a
            // slow or busy machine) is retried as any failure, within seconds. Not a refusal the
            // peer made on purpose (a used invite, this device removed): it would say it again.
            delay = target.sources.contains(.configured) && outcome == .rejected
                ? settings.reconnect.delay(afterFailures: target.rejections - 1, unit: jitter)
                : settings.rejected.delay(afterFailures: target.rejections - 1, unit: jitter)
        case .removedDevice:
            // Dropped, but remembered as refused: should another device's advert name this
            // address later, it waits out the rejected backoff first.
            target.rejections += 1
            target.phase = .waiting(until: now + settings.rejected.delay(afterFailures: target.rejections - 1, unit: jitter))
            targets[address] = target
            drop(address)
            if removedAddresses.count >= Self.rememberedLimit, let oldest = removedAddresses.min(by: { $0.value < $1.value }) {
                removedAddresses[oldest.key] = nil
            }
            removedAddresses[address] = nextOrder
            nextOrder += 1
            return true
        case .connectedElsewhere, .stopped:
            delay = settings.reconnect.max
        }
        target.phase = .waiting(until: now + delay)
        targets[address] = target
        if target.sources.isEmpty || outcome == .stopped { drop(address) }
        return false
    }

    /// When to ask ``due(now:)`` again if no attempt ends before (nil: only when one does).
    /// Targets that wait for a slot, or for their host's slot, are not counted: an attempt's end
    /// frees it.
    func nextWakeup() -> MonotonicInstant? {
        guard dialing < settings.concurrent else { return nil }
        var busyHosts: [String: Int] = [:]
        for target in targets.values where target.phase == .dialing { busyHosts[target.address.host, default: 0] += 1 }
        return targets.values.compactMap { target -> MonotonicInstant? in
            guard case .waiting(let until) = target.phase, busyHosts[target.address.host, default: 0] < settings.perHost else { return nil }
            return until
        }.min()
    }
}
