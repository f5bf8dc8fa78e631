import Foundation
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

enum MultiprocessBenchmark {
    /// N `peersync run` processes on 127.0.0.1 (no discovery), fully connected; each store gets
    /// edits through `peersync shift-type add`; digests polled with `peersync status --json`.
    static let multiprocess = Benchmark(name: "multiprocess") { quick in
        try await measured {
            guard FileManager.default.isExecutableFile(atPath: peersyncTool.path) else {
                throw BenchmarkFailure("no peersync binary at \(peersyncTool.path): build it (swift build --product peersync)")
            }
            let edits = quick ? 2 : 10
            let childCPU = Usage.cpuSeconds(children: true)
            var metrics: [String: Double] = [:]
            for n in quick ? [2] : [2, 4, 8] {
                let root = temporaryStoreDirectory()
                defer { try? FileManager.default.removeItem(atPath: root) }
                let directories = (0..<n).map { "\(root)/p\($0)" }
                try peersync(["init", "--store", directories[0], "--name", "p0"])
                for (i, directory) in directories.enumerated().dropFirst() {
                    let code = try peersync(["invite", "--store", directories[0]]).trimmingCharacters(in: .whitespacesAndNewlines)
                    try peersync(["init", "--store", directory, "--name", "p\(i)", "--join", code])
                }
                var nodes: [Process] = []
                defer { for node in nodes { stopProcess(node) } }
                var ports: [Int] = []
                for directory in directories {
                    let node = Process()
                    node.executableURL = peersyncTool
                    node.arguments = ["run", "--store", directory, "--listen", "127.0.0.1:0", "--no-discovery", "--log-level", "error"]
                        + ports.flatMap { ["--peer", "127.0.0.1:\($0)"] }
                    node.standardOutput = FileHandle.nullDevice
                    node.standardError = FileHandle.nullDevice
                    try node.run()
                    nodes.append(node)
                    let statusFile = URL(fileURLWithPath: directory).appendingPathComponent("node.json")
                    var port: Int?
                    _ = await waitUntil(.seconds(10)) {
                        guard let data = try? Data(contentsOf: statusFile),
                              let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
                              let listen = object["listen"] as? String else { return false }
                        port = listen.split(separator: ":").last.flatMap { Int($0) }
                        return port != nil && port != 0
                    }
                    guard let port else { throw BenchmarkFailure("peersync run in \(directory) wrote no port") }
                    ports.append(port)
                }
                // Every node connected to every other (node.json is rewritten every 0.5 s).
                let connectStart = ContinuousClock.now
                var baseline = 0
                let connected = try await pollStatuses(directories, timeout: .seconds(30)) { statuses in
                    baseline = statuses.reduce(0) { $0 + $1.bytesSent }
                    return statuses.allSatisfy { $0.peers == n - 1 }
                }
                guard connected else { throw BenchmarkFailure("multiprocess (\(n)): nodes did not all connect") }
                let connectMs = milliseconds(ContinuousClock.now - connectStart)
                // Edits, round-robin over the stores, each its own `peersync` process and commit.
                let start = ContinuousClock.now
                for e in 0..<edits {
                    for (i, directory) in directories.enumerated() {
                        try peersync(["shift-type", "add", "--store", directory, "--symbol", "P\(i)",
                                      "--title", "Edit \(e) on p\(i)", "--duration", "8h",
                                      "--description", "Added by the multiprocess benchmark."])
                    }
                }
                let editsDone = ContinuousClock.now
                let converged = try await pollStatuses(directories, timeout: .seconds(60)) { statuses in
                    Set(statuses.map(\.digest)).count == 1
                }
                let end = ContinuousClock.now
                guard converged else { throw BenchmarkFailure("multiprocess (\(n)): digests did not become equal") }
                try await Task.sleep(for: .milliseconds(1_100))  // two node.json rewrites: final byte counts
                let bytes = try directories.reduce(0) { $0 + (try nodeStatus($1).bytesSent) } - baseline
                let ops = n * edits
                metrics["\(n)p_connect_ms"] = connectMs
                metrics["\(n)p_converge_ms"] = milliseconds(end - start)
                metrics["\(n)p_after_last_edit_ms"] = milliseconds(end - editsDone)
                metrics["\(n)p_bytes_per_op"] = Double(bytes) / Double(ops)
                for node in nodes { stopProcess(node) }
                nodes = []
            }
            metrics["children_cpu_s"] = Usage.cpuSeconds(children: true) - childCPU
            return Result(name: "multiprocess",
                          detail: "N `peersync run` processes (127.0.0.1, --no-discovery, full mesh); \(edits) `shift-type add` per store, one process each; start of edits → equal digests in `status --json` (polled; each poll spawns N processes)",
                          metrics: metrics)
        }
    }

    /// Polls `status --json` of every store until `done` holds (bounded by `timeout`).
    static func pollStatuses(_ directories: [String], timeout: Duration,
                             _ done: ([(digest: String, peers: Int, bytesSent: Int)]) -> Bool) async throws -> Bool {
        let deadline = ContinuousClock.now + timeout
        while ContinuousClock.now < deadline {
            if done(try directories.map(nodeStatus)) { return true }
            try await Task.sleep(for: .milliseconds(5))
        }
        return false
    }
}
