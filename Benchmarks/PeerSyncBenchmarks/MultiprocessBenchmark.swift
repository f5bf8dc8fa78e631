import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The built `peersync` command next to this benchmark binary.
let peersyncTool = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().appendingPathComponent("peersync")

/// Runs `peersync args…` to completion (killed after `timeout`); returns its stdout.
@discardableResult
func peersync(_ arguments: [String], timeout: Duration = .seconds(30)) throws -> String {
    let process = Process()
    process.executableURL = peersyncTool
    process.arguments = arguments
    let output = Pipe()
    process.standardOutput = output
    process.standardError = FileHandle.nullDevice
    try process.run()
    let deadline = ContinuousClock.now + timeout
    while process.isRunning && ContinuousClock.now < deadline { usleep(1_000) }
    if process.isRunning {
        process.terminate()
        process.waitUntilExit()
        throw BenchmarkFailure("peersync \(arguments.first ?? "") timed out")
    }
    let data = output.fileHandleForReading.readDataToEndOfFile()
    guard process.terminationStatus == 0 else {
        throw BenchmarkFailure("peersync \(arguments.joined(separator: " ")) exited with \(process.terminationStatus)")
    }
    return String(decoding: data, as: UTF8.self)
}

/// `peersync status --json`: the digest, and bytes sent over the node's current sessions.
func nodeStatus(_ directory: String) throws -> (digest: String, peers: Int, bytesSent: Int) {
    let json = try peersync(["status", "--json", "--store", directory])
    guard let object = try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any],
          let digest = object["digest"] as? String else { throw BenchmarkFailure("unreadable status of \(directory)") }
    let peers = (object["node"] as? [String: Any])?["peers"] as? [[String: Any]] ?? []
    return (digest, peers.count, peers.reduce(0) { $0 + ($1["bytesSent"] as? Int ?? 0) })
}

/// SIGTERM, then wait up to 10 s (SIGKILL after that).
func stopProcess(_ process: Process) {
    guard process.isRunning else { return }
    kill(process.processIdentifier, SIGTERM)
    let deadline = ContinuousClock.now + .seconds(10)
    while process.isRunning && ContinuousClock.now < deadline { usleep(2_000) }
    if process.isRunning { kill(process.processIdentifier, SIGKILL) }
    process.waitUntilExit()
}

/// A `peersync run --commands` process: commands go to its stdin; its stdout lines are read on
/// a thread of their own and handed to `onLine` with the instant they arrived.
final class CommandNode: @unchecked Sendable {
    let process = Process()
    private let input = Pipe()
    private let output = Pipe()
    private let reader: Thread

    init(arguments: [String], onLine: @escaping @Sendable (String, ContinuousClock.Instant) -> Void) throws {
        process.executableURL = peersyncTool
        process.arguments = arguments
        process.standardInput = input
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        let handle = output.fileHandleForReading
        reader = Thread {
            var buffer: [UInt8] = []
            while true {
                let data = handle.availableData
                if data.isEmpty { return }
                buffer += data
                while let newline = buffer.firstIndex(of: 10) {
                    let line = String(decoding: buffer[..<newline], as: UTF8.self)
                    buffer.removeSubrange(...newline)
                    onLine(line, ContinuousClock.now)
                }
            }
        }
        try process.run()
        reader.start()
    }

    func send(_ line: String) {
        input.fileHandleForWriting.write(Data((line + "\n").utf8))
    }

    func stop() {
        try? input.fileHandleForWriting.close()
        stopProcess(process)
    }
}

/// Edit → visible bookkeeping across processes: an edit counts from its writer's "ok" to each
/// other process's "changed" line naming it.
final class CrossProcessTracker: Sendable {
    private struct State {
        var committed: [String: ContinuousClock.Instant] = [:]
        var seen: [String: [(node: Int, at: ContinuousClock.Instant)]] = [:]
        var digests: [Int: String] = [:]
    }
    private let state = Mutex(State())

    func line(_ line: String, from node: Int, at instant: ContinuousClock.Instant) {
        let words = line.split(separator: " ").map(String.init)
        state.withLock { s in
            switch words.first {
            case "ok": if words.count > 1 { s.committed[words[1]] = instant }
            case "changed": for id in words.dropFirst() { s.seen[id, default: []].append((node, instant)) }
            case "digest": if words.count > 1 { s.digests[node] = words[1] }
            default: break
            }
        }
    }

    func committedCount() -> Int { state.withLock { $0.committed.count } }

    /// Whether every committed edit was seen by every process but its writer.
    func allSeen(by processes: Int) -> Bool {
        state.withLock { s in
            s.committed.keys.allSatisfy { Set((s.seen[$0] ?? []).map(\.node)).count >= processes - 1 }
        }
    }

    /// Edit → first visible, per (edit, other process), in ms; and when the last became visible.
    func samples() -> (latencies: [Double], lastVisible: ContinuousClock.Instant?) {
        state.withLock { s in
            var latencies: [Double] = []
            var last: ContinuousClock.Instant?
            for (id, committed) in s.committed {
                var first: [Int: ContinuousClock.Instant] = [:]
                for (node, at) in s.seen[id] ?? [] where first[node] == nil { first[node] = at }
                for at in first.values {
                    latencies.append(milliseconds(at - committed))
                    last = max(last ?? at, at)
                }
            }
            return (latencies.sorted(), last)
        }
    }

    func clearDigests() { state.withLock { $0.digests = [:] } }
    func digests() -> [Int: String] { state.withLock { $0.digests } }
}

enum MultiprocessBenchmark {
    /// N `peersync run --commands` processes on 127.0.0.1 (no discovery), fully connected; the
    /// edits come from the benchmark through each process's stdin (long-lived writers: no process
    /// start per edit); "changed" lines on their stdout time edit → visible on every other process.
    static let multiprocess = Benchmark(name: "multiprocess") { quick in
        try await measured {
            guard FileManager.default.isExecutableFile(atPath: peersyncTool.path) else {
                throw BenchmarkFailure("no peersync binary at \(peersyncTool.path): build it (swift build --product peersync)")
            }
            let rounds = quick ? 3 : 20
            let childCPU = Usage.cpuSeconds(children: true)
            var metrics: [String: Double] = [:]
            for n in quick ? [2] : multiprocessSizes {
                let root = temporaryStoreDirectory()
                defer { try? FileManager.default.removeItem(atPath: root) }
                let directories = (0..<n).map { "\(root)/p\($0)" }
                try peersync(["init", "--store", directories[0], "--name", "p0"])
                for (i, directory) in directories.enumerated().dropFirst() {
                    let code = try peersync(["invite", "--store", directories[0]]).trimmingCharacters(in: .whitespacesAndNewlines)
                    try peersync(["init", "--store", directory, "--name", "p\(i)", "--join", code])
                }
                let tracker = CrossProcessTracker()
                var nodes: [CommandNode] = []
                defer { for node in nodes { node.stop() } }
                var ports: [Int] = []
                for (i, directory) in directories.enumerated() {
                    let node = try CommandNode(
                        arguments: ["run", "--commands", "--store", directory, "--listen", "127.0.0.1:0", "--no-discovery", "--log-level", "error"]
                            + ports.flatMap { ["--peer", "127.0.0.1:\($0)"] }) { line, at in tracker.line(line, from: i, at: at) }
                    nodes.append(node)
                    guard let port = await nodePort(directory) else { throw BenchmarkFailure("peersync run in \(directory) wrote no port") }
                    ports.append(port)
                }
                // Every node connected to every other (node.json is rewritten every 0.5 s).
                let connectStart = ContinuousClock.now
                let connected = await waitUntil(.seconds(60)) {
                    directories.allSatisfy { (try? nodeFile($0))?.peers == n - 1 }
                }
                guard connected else { throw BenchmarkFailure("multiprocess (\(n)): nodes did not all connect") }
                let connectMs = milliseconds(ContinuousClock.now - connectStart)
                // Joins happened while connecting; let the roster settle so the edits travel alone.
                _ = await waitUntil(.seconds(20)) { await digestsEqual(nodes, tracker) }
                try await Task.sleep(for: .milliseconds(1_100))
                let baseline = try directories.reduce(0) { $0 + (try nodeFile($1).bytesSent) }
                // A steady stream: every 10 ms one edit on each process (a new record each).
                let start = ContinuousClock.now
                for round in 0..<rounds {
                    for (i, node) in nodes.enumerated() {
                        node.send("put \(UUID().uuidString) symbol=P\(i) title=Edit_\(round)_on_p\(i) duration=28800 description=Added_by_the_multiprocess_benchmark.")
                    }
                    try await Task.sleep(until: start + .milliseconds(10 * (round + 1)))
                }
                let edits = n * rounds
                let allVisible = await waitUntil(.seconds(60)) { tracker.committedCount() == edits && tracker.allSeen(by: n) }
                let converged = await waitUntil(.seconds(30)) { await digestsEqual(nodes, tracker) }
                let end = ContinuousClock.now
                guard allVisible, converged else { throw BenchmarkFailure("multiprocess (\(n)): edits did not reach every process") }
                let (latencies, lastVisible) = tracker.samples()
                try await Task.sleep(for: .milliseconds(1_100))  // two node.json rewrites: final byte counts
                let bytes = try directories.reduce(0) { $0 + (try nodeFile($1).bytesSent) } - baseline
                metrics["\(n)p_connect_ms"] = connectMs
                metrics["\(n)p_edits"] = Double(edits)
                metrics["\(n)p_stream_ms"] = Double(rounds * 10)
                metrics["\(n)p_p50_ms"] = percentile(latencies, 0.5)
                metrics["\(n)p_p99_ms"] = percentile(latencies, 0.99)
                metrics["\(n)p_max_ms"] = latencies.last ?? 0
                metrics["\(n)p_all_visible_ms"] = milliseconds((lastVisible ?? end) - start)
                metrics["\(n)p_converge_ms"] = milliseconds(end - start)
                metrics["\(n)p_bytes_per_op"] = Double(bytes) / Double(edits)
                for node in nodes { node.stop() }
                nodes = []
            }
            metrics["children_cpu_s"] = Usage.cpuSeconds(children: true) - childCPU
            return Result(name: "multiprocess",
                          detail: "N `peersync run --commands` processes (127.0.0.1, --no-discovery, full mesh), edits through their stdin: every 10 ms one new shift type on each, \(rounds) rounds; latency = writer's commit (\"ok\") → \"changed\" on each other process; converge = all digests equal",
                          metrics: metrics)
        }
    }

    /// Asks every node for its digest; true once all answered the same.
    static func digestsEqual(_ nodes: [CommandNode], _ tracker: CrossProcessTracker) async -> Bool {
        tracker.clearDigests()
        for node in nodes { node.send("digest") }
        _ = await waitUntil(.seconds(2)) { tracker.digests().count == nodes.count }
        let digests = tracker.digests()
        return digests.count == nodes.count && Set(digests.values).count == 1
    }
}

/// Process counts of the multiprocess benchmark (`PEERSYNC_MULTIPROCESS_SIZES=2,4` to pick others).
let multiprocessSizes: [Int] = ProcessInfo.processInfo.environment["PEERSYNC_MULTIPROCESS_SIZES"].map {
    $0.split(separator: ",").compactMap { Int($0) }
} ?? [2, 4, 8, 16]

/// The port and peers of a running node, from DIR/node.json.
func nodeFile(_ directory: String) throws -> (port: Int, peers: Int, bytesSent: Int) {
    let data = try Data(contentsOf: URL(fileURLWithPath: directory).appendingPathComponent("node.json"))
    guard let object = try JSONSerialization.jsonObject(with: data) as? [String: Any], let listen = object["listen"] as? String else {
        throw BenchmarkFailure("unreadable node.json in \(directory)")
    }
    let peers = object["peers"] as? [[String: Any]] ?? []
    return (listen.split(separator: ":").last.flatMap { Int($0) } ?? 0, peers.count,
            peers.reduce(0) { $0 + ($1["bytesSent"] as? Int ?? 0) })
}

/// Waits (up to 10 s) for a node's listening port in DIR/node.json.
func nodePort(_ directory: String) async -> Int? {
    var port: Int?
    _ = await waitUntil(.seconds(10)) {
        port = try? nodeFile(directory).port
        return port != nil && port != 0
    }
    return port
}
