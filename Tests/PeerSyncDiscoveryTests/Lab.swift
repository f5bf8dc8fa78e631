import Foundation
@_spi(Engine) import PeerSyncCRDT
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Whether this machine can run the network-namespace lab: root, and the daemons and `ip` installed.
enum LabEnvironment {
    static let isUsable: Bool = getuid() == 0 && ["avahi-daemon", "dbus-daemon", "ip", "unshare", "setsid"].allSatisfy(isInstalled)

    static func isInstalled(_ command: String) -> Bool {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? ""
        let directories = path.split(separator: ":").map(String.init) + ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        return directories.contains { access("\($0)/\(command)", X_OK) == 0 }
    }
}

struct LabError: Error, CustomStringConvertible {
    let description: String
}

struct CommandResult {
    let status: Int32
    let output: String
}

/// Runs `executable` to completion, collecting its standard output; killed after `timeout`.
func runCommand(_ executable: String, _ arguments: [String], environment: [String: String]? = nil,
                timeout: Duration) throws -> CommandResult {
    let child = try LabProcess(executable, arguments, environment: environment ?? ProcessInfo.processInfo.environment)
    let deadline = ContinuousClock.now + timeout
    var lines: [String] = []
    while let line = child.readLine(until: deadline) {
        lines.append(line)
    }
    let remaining = deadline - ContinuousClock.now
    let status = child.waitForExit(timeout: max(remaining, .milliseconds(500))) ?? child.terminate(grace: .seconds(2))
    return CommandResult(status: status, output: lines.joined(separator: "\n"))
}

/// CLOCK_MONOTONIC in nanoseconds: the clock the probe stamps its lines with (system-wide).
func monotonicNanoseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

/// One lab built by Scripts/netlab.sh, with a prefix and state directory of its own.
final class Lab {
    static let scriptPath = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Scripts/netlab.sh").path

    let prefix: String
    let directory: String
    let subnet = "10.77.0"
    let environment: [String: String]

    init() {
        let suffix = String(UInt32.random(in: 0...UInt32.max), radix: 16)
        prefix = "pst" + String(repeating: "0", count: 8 - suffix.count) + suffix
        directory = "/tmp/peersync-lab/\(prefix)"
        var environment = ProcessInfo.processInfo.environment
        environment["LAB_PREFIX"] = prefix
        environment["LAB_DIR"] = directory
        environment["LAB_SUBNET"] = subnet
        environment["LAB_TIMEOUT"] = "15"
        self.environment = environment
    }

    func run(_ arguments: [String], timeout: Duration = .seconds(60)) throws -> CommandResult {
        try runCommand(Lab.scriptPath, arguments, environment: environment, timeout: timeout)
    }

    /// Builds `hosts` hosts (the script tears down by itself if this fails).
    func up(_ hosts: Int) throws {
        let started = ContinuousClock.now
        let result = try run(["up", String(hosts)], timeout: .seconds(120))
        guard result.status == 0 else { throw LabError(description: "netlab.sh up \(hosts) failed (\(result.status))") }
        print("lab \(prefix): \(hosts) hosts up in \(ContinuousClock.now - started)")
    }

    func stopAvahi(_ host: Int) throws {
        let result = try run(["stop-avahi", "h\(host)"])
        guard result.status == 0 else { throw LabError(description: "netlab.sh stop-avahi h\(host) failed") }
    }

    func startAvahi(_ host: Int) throws {
        let result = try run(["start-avahi", "h\(host)"])
        guard result.status == 0 else { throw LabError(description: "netlab.sh start-avahi h\(host) failed") }
    }

    func address(ofHost host: Int) -> String { "\(subnet).\(10 + host)" }

    /// The lab's namespaces that exist now.
    func namespaces() -> [String] {
        let listing = (try? runCommand("/usr/bin/env", ["ip", "netns", "list"], timeout: .seconds(10)).output) ?? ""
        return listing.split(separator: "\n").compactMap { line in
            let name = String(line.split(separator: " ").first ?? "")
            return name.hasPrefix(prefix + "-") ? name : nil
        }
    }

    /// Every process inside one of the lab's namespaces.
    func processes() -> [Int32] {
        namespaces().flatMap { namespace in
            let output = (try? runCommand("/usr/bin/env", ["ip", "netns", "pids", namespace], timeout: .seconds(10)).output) ?? ""
            return output.split(separator: "\n").compactMap { Int32($0.trimmingCharacters(in: .whitespaces)) }
        }
    }

    /// Tears the lab down and checks nothing of it is left: no namespace of its prefix, none of
    /// its processes alive, no state directory, and no avahi-daemon in the root namespace.
    func downAndVerify() {
        let processes = processes()
        do {
            let result = try run(["down"], timeout: .seconds(120))
            #expect(result.status == 0, "netlab.sh down failed")
        } catch {
            Issue.record("netlab.sh down could not run: \(error)")
        }
        #expect(namespaces().isEmpty, "namespaces of \(prefix) left behind")
        let survivors = processes.filter(isAlive)
        #expect(survivors.isEmpty, "lab processes still alive: \(survivors)")
        #expect(!FileManager.default.fileExists(atPath: directory), "\(directory) left behind")
        let strays = liveProcesses().filter { commandLine(of: $0).contains(directory) }
        #expect(strays.isEmpty, "processes referring to \(directory) still alive: \(strays)")
        #expect(avahiDaemonsInRootNamespace().isEmpty, "an avahi-daemon runs in the root network namespace")
    }
}

func isAlive(_ pid: Int32) -> Bool {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
          let close = stat.lastIndex(of: ")") else { return false }
    let state = stat[stat.index(after: close)...].trimmingCharacters(in: .whitespaces).first
    return state != "Z" && state != "X"
}

func liveProcesses() -> [Int32] {
    let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
    return entries.compactMap(Int32.init).filter(isAlive)
}

func commandLine(of pid: Int32) -> String {
    guard let data = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline") else { return "" }
    return String(decoding: data.map { $0 == 0 ? UInt8(ascii: " ") : $0 }, as: UTF8.self)
}

/// avahi-daemon processes whose network namespace is this test process's (the root one) or the
/// kernel's initial namespace.
func avahiDaemonsInRootNamespace() -> [Int32] {
    let ownNamespace = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/ns/net")) ?? "?"
    return liveProcesses().filter { pid in
        let name = (try? String(contentsOfFile: "/proc/\(pid)/comm", encoding: .utf8))?
            .trimmingCharacters(in: .whitespacesAndNewlines)
        guard name == "avahi-daemon" else { return false }
        let namespace = (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/ns/net")) ?? "unreadable"
        return namespace == ownNamespace || namespace == "net:[4026531833]"
    }
}

/// One line of `peersync-discovery-probe` output.
struct ProbeEvent: Decodable, CustomStringConvertible {
    let event: String
    let t: UInt64
    let name: String?
    let replica: String?
    let group: String?
    let version: Int?
    let host: String?
    let port: UInt16?
    let code: Int32?
    let error: String?
    /// On "stopped": whether `stopAndWait()` saw the discovery thread finish.
    let exited: Bool?

    var description: String {
        [event, name, replica.map { String($0.prefix(8)) }, host, port.map(String.init), code.map(String.init)]
            .compactMap { $0 }.joined(separator: " ")
    }
}

/// A `peersync-discovery-probe` running inside a lab host, and the events it printed so far.
final class Probe {
    static let binaryPath = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        .appendingPathComponent("peersync-discovery-probe").path

    let host: Int
    let name: String
    let port: UInt16
    let group: String
    let replica: ReplicaID
    let child: LabProcess
    private(set) var events: [ProbeEvent] = []
    private var exitStatus: Int32?

    /// Starts the probe in lab host `host`. `wrapper` runs before the probe inside the host
    /// (e.g. `env DBUS_SYSTEM_BUS_ADDRESS=...`); it must exec the probe so the PID stays the same.
    init(lab: Lab, host: Int, name: String, port: UInt16, group: String, replica: ReplicaID = .random(),
         wrapper: [String] = []) throws {
        self.host = host
        self.name = name
        self.port = port
        self.group = group
        self.replica = replica
        let arguments = ["exec", "h\(host)"] + wrapper + [
            Probe.binaryPath, "--name", name, "--port", String(port), "--replica", replica.description, "--group", group,
        ]
        child = try LabProcess(Lab.scriptPath, arguments, environment: lab.environment)
    }

    deinit { _ = stop() }

    /// Reads whatever the probe printed, waiting at most `slice` for the first line.
    func pump(for slice: Duration = .milliseconds(20)) {
        while let line = child.readLine(until: .now + slice) {
            record(line)
        }
    }

    private func record(_ line: String) {
        if let event = try? JSONDecoder().decode(ProbeEvent.self, from: Data(line.utf8)) {
            events.append(event)
        } else {
            Issue.record("probe h\(host) printed a line that is not an event: \(line)")
        }
    }

    var isRunning: Bool { !child.hasExited }

    /// SIGTERM, then collects the remaining lines until the probe exits (SIGKILL after 10 s).
    /// Returns the exit status; calling it again returns the same.
    @discardableResult
    func stop() -> Int32 {
        if let exitStatus { return exitStatus }
        if !child.hasExited { kill(child.pid, SIGTERM) }
        let deadline = ContinuousClock.now + .seconds(10)
        while let line = child.readLine(until: deadline) {
            record(line)
        }
        let status = child.terminate(grace: .seconds(2))
        exitStatus = status
        return status
    }

    func events(_ kind: String) -> [ProbeEvent] { events.filter { $0.event == kind } }

    /// `.found` events for `other`'s replica.
    func found(_ other: Probe) -> [ProbeEvent] {
        events.filter { $0.event == "found" && $0.replica == other.replica.description }
    }

    /// `.lost` events for `other`'s service name.
    func lost(_ other: Probe) -> [ProbeEvent] {
        events.filter { $0.event == "lost" && $0.name == other.name }
    }

    /// Checks what every run must satisfy: never its own advertisement; per service name, found
    /// and lost alternate (a repeated found only when host, port or TXT changed); no lost without
    /// a found; an unavailable only at start or after a recovered.
    func checkInvariants() {
        var current: [String: ProbeEvent] = [:]
        var available: Bool? = nil
        for event in events {
            switch event.event {
            case "found":
                #expect(event.replica != replica.description, "h\(host) reported its own advertisement")
                let name = event.name ?? ""
                if let previous = current[name] {
                    let changed = previous.host != event.host || previous.port != event.port
                        || previous.replica != event.replica || previous.group != event.group
                        || previous.version != event.version
                    #expect(changed, "h\(host) reported \(name) found twice with nothing changed")
                }
                current[name] = event
            case "lost":
                let name = event.name ?? ""
                #expect(current[name] != nil, "h\(host) reported \(name) lost without found")
                current[name] = nil
            case "unavailable":
                #expect(available != false, "h\(host) reported unavailable twice in one outage")
                available = false
            case "recovered":
                #expect(available == false, "h\(host) reported recovered without an outage")
                available = true
            default:
                break
            }
        }
    }
}

/// Reads from all probes until `condition` holds or `timeout` passes; returns whether it held.
@discardableResult
func waitUntil(_ probes: [Probe], timeout: Duration, _ condition: () -> Bool) -> Bool {
    let deadline = ContinuousClock.now + timeout
    while true {
        for probe in probes { probe.pump() }
        if condition() { return true }
        if ContinuousClock.now >= deadline { return false }
    }
}

/// Reads from all probes for `duration` (to see what else they print).
func observe(_ probes: [Probe], for duration: Duration) {
    waitUntil(probes, timeout: duration) { false }
}
