#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Dispatch
import Foundation
import PeerSyncCRDT
import Synchronization

/// Finds PeerSync nodes on the LAN with DNS-SD (Avahi's Bonjour compatibility layer on Linux),
/// and advertises this node.
///
/// ```swift
/// let discovery = PeerDiscovery()
/// for await event in discovery.start(advertising: advertisement) {
///     if case .found(let peer) = event { dial(peer.host, peer.port) }
/// }
/// ```
///
/// One run registers the advertisement, browses `serviceType`, resolves each instance (SRV + TXT)
/// and looks up its host's A record; it reports each peer once (IPv6 doubles and repeated
/// resolutions collapse) and never reports its own advertisement (same replica ID).
///
/// If no avahi daemon is reachable — at start or later — it reports
/// ``DiscoveryEvent/unavailable(_:)`` once, tears its DNS-SD references down and retries with
/// backoff (0.5 s doubling to 5 s); when the daemon is back it registers and browses again and
/// reports ``DiscoveryEvent/recovered``. Nothing needs restarting.
///
/// Threading: each run owns one dedicated thread. Every DNS-SD call (create, process, deallocate)
/// happens on it, driven by `poll()` on the references' sockets, so `DNSServiceProcessResult`
/// never blocks and all callbacks run there. The state the callbacks touch is confined to that
/// thread; the only state shared with callers is the current run, guarded by a `Mutex`, and the
/// run's stop flag (an `Atomic`) and wake-up pipe.
public final class PeerDiscovery: Sendable {
    /// The DNS-SD service type browsed and registered, e.g. `_peersync._tcp`.
    public let serviceType: String
    private let current = Mutex<DiscoveryRun?>(nil)

    /// A discovery for `serviceType` (default `_peersync._tcp`). Nothing starts until ``start(advertising:)``.
    public init(serviceType: String = "_peersync._tcp") {
        self.serviceType = serviceType
        _ = PeerDiscovery.quietCompatLayer
    }

    deinit {
        stop()
    }

    /// Avahi's compat layer prints a banner on first use unless AVAHI_COMPAT_NOWARN is set.
    private static let quietCompatLayer: Void = {
        setenv("AVAHI_COMPAT_NOWARN", "1", 1)
    }()

    /// Starts advertising `advertising` (if not nil) and browsing; returns the events.
    ///
    /// The stream ends after ``stop()``, or stops the run when its consumer goes away. Calling
    /// `start` while a run is active returns a stream that ends at once; after ``stop()`` it may
    /// be called again.
    public func start(advertising advertisement: PeerAdvertisement?) -> AsyncStream<DiscoveryEvent> {
        // Discovery produces a handful of events per peer change, so an unbounded buffer stays small.
        let (stream, continuation) = AsyncStream.makeStream(of: DiscoveryEvent.self, bufferingPolicy: .unbounded)
        let run: DiscoveryRun? = current.withLock { current in
            if let existing = current, !existing.hasExited { return nil }
            let run = DiscoveryRun()
            current = run
            return run
        }
        guard let run else {
            continuation.finish()
            return stream
        }
        continuation.onTermination = { [weak run] _ in run?.requestStop() }
        let serviceType = serviceType
        let thread = Thread {
            let engine = DiscoveryEngine(
                run: run, continuation: continuation, serviceType: serviceType, advertisement: advertisement)
            engine.runLoop()
        }
        thread.name = "peersync-discovery"
        thread.start()
        return stream
    }

    /// Stops the current run: withdraws the advertisement, deallocates every DNS-SD reference and
    /// ends the stream. Waits (at most 10 s) for the discovery thread to finish. Safe to call twice.
    public func stop() {
        let run = current.withLock { current in
            let run = current
            current = nil
            return run
        }
        guard let run else { return }
        run.requestStop()
        run.waitUntilExited(timeout: .seconds(10))
    }
}

/// What the caller's side and the discovery thread of one run share: a stop flag, a pipe that
/// wakes the thread's `poll()`, and an "exited" signal.
final class DiscoveryRun: Sendable {
    private let stopFlag = Atomic<Bool>(false)
    private let exitedFlag = Atomic<Bool>(false)
    private let exitedSignal = DispatchSemaphore(value: 0)
    /// Read end of the wake-up pipe (-1 if the pipe could not be made; the thread then notices a
    /// stop within its longest poll timeout).
    let wakeReadFD: Int32
    private let wakeWriteFD: Int32

    init() {
        var fds: [Int32] = [-1, -1]
        if pipe(&fds) == 0 {
            for fd in fds {
                _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
                _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            }
        } else {
            fds = [-1, -1]
        }
        wakeReadFD = fds[0]
        wakeWriteFD = fds[1]
    }

    deinit {
        if wakeReadFD >= 0 { close(wakeReadFD) }
        if wakeWriteFD >= 0 { close(wakeWriteFD) }
    }

    var stopRequested: Bool { stopFlag.load(ordering: .acquiring) }
    var hasExited: Bool { exitedFlag.load(ordering: .acquiring) }

    func requestStop() {
        guard !stopFlag.exchange(true, ordering: .acquiringAndReleasing) else { return }
        guard wakeWriteFD >= 0 else { return }
        var byte: UInt8 = 1
        _ = write(wakeWriteFD, &byte, 1)
    }

    /// Empties the wake-up pipe (called by the discovery thread).
    func drainWakeups() {
        guard wakeReadFD >= 0 else { return }
        var buffer = [UInt8](repeating: 0, count: 64)
        while read(wakeReadFD, &buffer, buffer.count) > 0 {}
    }

    /// Called once by the discovery thread as its last action.
    func markExited() {
        exitedFlag.store(true, ordering: .releasing)
        exitedSignal.signal()
    }

    func waitUntilExited(timeout: DispatchTimeInterval) {
        guard !hasExited else { return }
        if exitedSignal.wait(timeout: .now() + timeout) == .success {
            exitedSignal.signal()  // let any other waiter through too
        }
    }
}
