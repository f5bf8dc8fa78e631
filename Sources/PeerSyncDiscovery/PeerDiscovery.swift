#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation
@_spi(Engine) import PeerSyncCRDT
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
/// run's stop flag (an `Atomic`), wake-up pipe and exit signal. No call blocks its caller: ``stop()``
/// only requests the stop, and ``stopAndWait(timeout:)`` suspends until the thread has exited.
///
/// Every decision (presence counting, de-duplication, retries, timeouts, backoff, the grace after
/// an outage) is made by `DiscoveryPolicy`, a value type tested without sockets or clocks; the
/// thread only bridges DNS-SD to it.
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
    /// be called again. A new run lets runs that are still stopping (of any `PeerDiscovery` in
    /// the process) finish first, at most 10 s, so two runs never advertise the same name at once.
    public func start(advertising advertisement: PeerAdvertisement?) -> AsyncStream<DiscoveryEvent> {
        // Discovery produces a handful of events per peer change, so an unbounded buffer stays small.
        let (stream, continuation) = AsyncStream.makeStream(of: DiscoveryEvent.self, bufferingPolicy: .unbounded)
        let run: DiscoveryRun? = current.withLock { current in
            if let existing = current, !existing.stopRequested, !existing.hasExited { return nil }
            let run = DiscoveryRun()
            current = run
            return run
        }
        guard let run else {
            continuation.finish()
            return stream
        }
        let predecessors = DiscoveryRun.stopping(except: run)
        continuation.onTermination = { [weak run] _ in run?.requestStop() }
        let serviceType = serviceType
        let thread = Thread {
            DiscoveryRun.blockUntilExited(predecessors, timeout: PeerDiscovery.stopTimeout)
            let engine = DiscoveryEngine(
                run: run, continuation: continuation, serviceType: serviceType, advertisement: advertisement)
            engine.runLoop()
        }
        thread.name = "peersync-discovery"
        thread.start()
        return stream
    }

    /// Asks the current run to stop and returns at once (it never blocks). The run's thread then
    /// withdraws the advertisement, deallocates every DNS-SD reference and ends the stream,
    /// normally within a quarter of a second. Safe to call twice, and from any context; use
    /// ``stopAndWait(timeout:)`` to know when the run has finished.
    public func stop() {
        current.withLock { $0 }?.requestStop()
    }

    /// Stops the current run, like ``stop()``, and suspends until its thread has withdrawn the
    /// advertisement, deallocated every DNS-SD reference and ended the stream — at most `timeout`.
    /// It never blocks a thread, so it may be awaited in an actor or on the cooperative pool.
    ///
    /// - Returns: true if the run has finished (or there was none); false if it did not finish
    ///   within `timeout` or the calling task was cancelled (the run still stops later).
    @discardableResult
    public func stopAndWait(timeout: Duration = PeerDiscovery.stopTimeout) async -> Bool {
        guard let run = current.withLock({ $0 }) else { return true }
        run.requestStop()
        let exited = await run.waitForExit(timeout: timeout)
        if exited { current.withLock { if $0 === run { $0 = nil } } }
        return exited
    }

    /// How long ``stopAndWait(timeout:)`` waits by default, and how long a new run waits for
    /// stopping ones before it starts anyway.
    public static let stopTimeout: Duration = .seconds(10)
}
