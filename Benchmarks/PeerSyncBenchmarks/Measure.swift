import Foundation
import Logging
import PeerSync
import PeerSyncWire
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// CPU time, resident memory and peak memory of this process (Linux /proc; 0 where unavailable).
enum Usage {
    /// User + system CPU seconds of this process (`RUSAGE_SELF`) or of its waited-for children.
    static func cpuSeconds(children: Bool = false) -> Double {
        var usage = rusage()
        #if canImport(Glibc)
        let who = children ? RUSAGE_CHILDREN.rawValue : RUSAGE_SELF.rawValue
        #else
        let who = children ? RUSAGE_CHILDREN : RUSAGE_SELF
        #endif
        guard getrusage(who, &usage) == 0 else { return 0 }
        func seconds(_ t: timeval) -> Double { Double(t.tv_sec) + Double(t.tv_usec) / 1e6 }
        return seconds(usage.ru_utime) + seconds(usage.ru_stime)
    }

    /// A `/proc/self/status` line in bytes (`VmRSS`, `VmHWM`).
    static func statusBytes(_ key: String) -> Double {
        guard let text = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8) else { return 0 }
        for line in text.split(separator: "\n") where line.hasPrefix(key + ":") {
            let number = line.dropFirst(key.count + 1).split(whereSeparator: { $0 == " " || $0 == "\t" }).first.flatMap { Double($0) } ?? 0
            return number * 1024  // the kernel reports kB
        }
        return 0
    }

    /// Resets VmHWM to the current RSS (Linux ≥ 4.0: `echo 5 > /proc/self/clear_refs`), so each
    /// benchmark reports its own peak. Best effort.
    static func resetPeak() {
        try? Data("5".utf8).write(to: URL(fileURLWithPath: "/proc/self/clear_refs"))
    }
}

/// Runs `body` and adds `cpu_s` (this process, user + system) and `peak_rss_mb` (VmHWM) to its metrics.
func measured(_ body: () async throws -> Result) async throws -> Result {
    Usage.resetPeak()
    let cpu = Usage.cpuSeconds()
    var result = try await body()
    result.metrics["cpu_s"] = Usage.cpuSeconds() - cpu
    result.metrics["peak_rss_mb"] = Usage.statusBytes("VmHWM") / 1_048_576
    return result
}

/// Polls `condition` every millisecond until it holds or `timeout` passes. Returns whether it held.
func waitUntil(_ timeout: Duration, _ condition: () async -> Bool) async -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if await condition() { return true }
        try? await Task.sleep(for: .milliseconds(1))
    }
    return await condition()
}

struct BenchmarkFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

extension TransferMode {
    /// Metric prefix: `deltas` or `fullstate`.
    var label: String { self == .deltas ? "deltas" : "fullstate" }
}

/// A sync node over a store in a temporary directory, on 127.0.0.1 with real TLS, with the
/// transfer mode under test. The store outlives the node, so a partition is a stopped node and
/// healing is a new node on the same store.
struct PeerUnderTest: Sendable {
    let directory: String
    let store: ReplicaStore
    let node: SyncNode
    let port: UInt16
    let identity: LocalIdentity

    static func start(_ name: String, secret group: BenchGroup, transfer: TransferMode,
                      store existing: (directory: String, store: ReplicaStore, identity: LocalIdentity)? = nil) async throws -> PeerUnderTest {
        let directory = existing?.directory ?? temporaryStoreDirectory()
        let store = try existing?.store ?? ReplicaStore.create(directory: directory, name: name)
        let identity = try existing?.identity ?? group.admit(store)
        var logger = Logger(label: "bench.\(name)")
        logger.logLevel = ProcessInfo.processInfo.environment["PEERSYNC_BENCH_LOG"].flatMap(Logger.Level.init(rawValue:)) ?? .error
        var configuration = SyncConfiguration(security: .tls, listen: .loopback(0), transfer: transfer)
        // Every peer here dials from 127.0.0.1; on a LAN each device has its own address. The
        // per-address inbound limit (16, against one host flooding) would refuse a 32-peer mesh.
        configuration.limits.inboundConnectionsPerAddress = configuration.limits.inboundConnections
        // For trying other coalescing windows without a rebuild (the default is the library's).
        if let ms = ProcessInfo.processInfo.environment["PEERSYNC_DELTA_COALESCING_MS"].flatMap(Double.init) {
            configuration.timing.deltaCoalescing = .microseconds(Int64(ms * 1_000))
        }
        if let count = ProcessInfo.processInfo.environment["PEERSYNC_DELTA_COALESCING_COUNT"].flatMap(Int.init) {
            configuration.timing.deltaCoalescingCount = count
        }
        let node = try SyncNode(storage: StoreSyncStorage(store), replicaID: store.replicaID, name: name, identity: identity,
                                configuration: configuration, logger: logger)
        let port = try await node.start()
        return PeerUnderTest(directory: directory, store: store, node: node, port: port, identity: identity)
    }

    /// A new node on the same store (after `stop(keepStore: true)`).
    func restarted(secret group: BenchGroup) async throws -> PeerUnderTest {
        try await .start(store.state.name, secret: group, transfer: node.configuration.transfer, store: (directory, store, identity))
    }

    func stop(keepStore: Bool = false) async {
        await node.stop()
        if !keepStore { try? FileManager.default.removeItem(atPath: directory) }
    }
}

/// Sum of traffic over nodes (each byte counted once: what every node sent).
func totalTraffic(_ peers: [PeerUnderTest]) async -> (bytes: Int, messages: Int) {
    var bytes = 0
    var messages = 0
    for peer in peers {
        let t = await peer.node.traffic()
        bytes += t.bytesSent
        messages += t.framesSent
    }
    return (bytes, messages)
}

/// Frame bytes every node sent, by message name (TLS not included).
func frameBytesByMessage(_ peers: [PeerUnderTest]) async -> [String: Int] {
    var total: [String: Int] = [:]
    for peer in peers {
        for (type, bytes) in await peer.node.traffic().frameBytesSentByType {
            let name = Message.Kind(rawValue: type).map { "\($0)" } ?? (type == 16 ? "seen" : "type\(type)")
            total[name, default: 0] += bytes
        }
    }
    return total
}

/// The frame bytes each message type sent between two ``frameBytesByMessage(_:)`` readings
/// (types that sent nothing are left out).
func frameBytesSent(from before: [String: Int], to after: [String: Int]) -> [String: Int] {
    var sent: [String: Int] = [:]
    for (name, bytes) in after where bytes > before[name] ?? 0 { sent[name] = bytes - (before[name] ?? 0) }
    return sent
}

func allEqual(_ peers: [PeerUnderTest]) -> Bool {
    guard let first = peers.first?.store.state.digest else { return true }
    return peers.dropFirst().allSatisfy { $0.store.state.digest == first }
}

/// Dials every pair once (lower index dials higher) and waits until every node has
/// `peers.count - 1` established sessions. Returns whether that happened within `timeout`.
func connectMesh(_ peers: [PeerUnderTest], timeout: Duration) async -> Bool {
    for (i, peer) in peers.enumerated() {
        for other in peers[(i + 1)...] { await peer.node.addPeer(.loopback(other.port)) }
    }
    return await waitUntil(timeout) {
        for peer in peers where await peer.node.peers().count < peers.count - 1 { return false }
        return true
    }
}

/// Edit → visible bookkeeping: when each edit was committed, when a watching node first saw it.
///
/// An edit is announced with ``expect(_:version:)`` *before* its write: the node ships from the
/// store's commit feed, on its own task, so the peer can see an edit before the writer's
/// `write` call has returned (announced after the write, such an edit was never matched and
/// the run "did not converge" with every digest equal). ``committed(_:version:at:)`` then sets
/// the instant latencies are measured from (the commit's end, as before); an edit seen before
/// that counts as latency 0.
final class VisibilityTracker: Sendable {
    private struct Edit {
        var version: Int64
        /// The commit's end; nil while the write is still in progress.
        var at: ContinuousClock.Instant?
    }
    private struct State {
        var committed: [RecordKey: [Edit]] = [:]
        /// Edits seen before their write returned.
        var seenEarly: Set<EarlyEdit> = []
        var samples: [Double] = []
    }
    private struct EarlyEdit: Hashable {
        let key: RecordKey
        let version: Int64
    }
    private let state = Mutex(State())

    /// An edit of `key` to `version` is about to be written.
    func expect(_ key: RecordKey, version: Int64) {
        state.withLock { $0.committed[key, default: []].append(Edit(version: version, at: nil)) }
    }

    /// The write announced by ``expect(_:version:)`` returned at `instant` (`wrote` false: it
    /// changed nothing, so nothing will be seen).
    func committed(_ key: RecordKey, version: Int64, at instant: ContinuousClock.Instant, wrote: Bool = true) {
        state.withLock { s in
            if s.seenEarly.remove(EarlyEdit(key: key, version: version)) != nil {
                if wrote { s.samples.append(0) }
                return
            }
            guard var edits = s.committed[key], let index = edits.firstIndex(where: { $0.version == version && $0.at == nil }) else { return }
            if wrote { edits[index].at = instant } else { edits.remove(at: index) }
            s.committed[key] = edits.isEmpty ? nil : edits
        }
    }

    /// `key` is now at `version` on the watcher: every edit of it up to `version` is visible.
    func seen(_ key: RecordKey, version: Int64, at instant: ContinuousClock.Instant) {
        state.withLock { s in
            guard let pending = s.committed[key] else { return }
            var rest: [Edit] = []
            for edit in pending {
                guard edit.version <= version else {
                    rest.append(edit)
                    continue
                }
                if let at = edit.at {
                    s.samples.append(milliseconds(instant - at))
                } else {
                    s.seenEarly.insert(EarlyEdit(key: key, version: edit.version))
                }
            }
            s.committed[key] = rest.isEmpty ? nil : rest
        }
    }

    var pendingKeys: [RecordKey] { state.withLock { Array($0.committed.keys) } }
    var samples: [Double] { state.withLock { $0.samples.sorted() } }
}

/// Devices of one group for a benchmark run; each store admitted takes the next device.
final class BenchGroup: Sendable {
    let devices: LocalGroup
    private let next = Mutex(0)

    init(size: Int = 70) {
        devices = try! LocalGroup.make(names: (0..<size).map { "device\($0)" })
    }

    /// Installs the group's roster in `store` as the next device; returns its identity.
    func admit(_ store: ReplicaStore) throws -> LocalIdentity {
        let member = next.withLock { n in
            defer { n += 1 }
            return n
        }
        try devices.install(into: store, member: member)
        return devices.identity(member)
    }
}

/// Runs blocking work (a stream of fsynced commits) on a thread of its own, off the cooperative
/// pool, and waits for it without blocking the caller's thread.
final class WriterThread: Sendable {
    private let queue = DispatchQueue(label: "bench.writer")

    func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            queue.async {
                do { continuation.resume(returning: try body()) } catch { continuation.resume(throwing: error) }
            }
        }
    }
}
