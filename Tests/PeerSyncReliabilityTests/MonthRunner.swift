import Foundation
import PeerSyncTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// A `peersync run` process whose standard error goes to a log file.
final class NodeProcess: @unchecked Sendable {
    let process = Process()
    let device: Int
    let log: String

    init(device: Int, arguments: [String], log: String) throws {
        self.device = device
        self.log = log
        _ = FileManager.default.createFile(atPath: log, contents: nil)
        let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: log))
        defer { try? handle.close() }
        process.executableURL = URL(fileURLWithPath: Nodes.binary)
        process.arguments = arguments
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = FileHandle.nullDevice
        process.standardError = handle
        try process.run()
    }

    var pid: Int32 { process.processIdentifier }

    /// Sends `signal`, waits up to `timeout` for the exit, SIGKILLs after that. Returns whether it
    /// exited within `timeout`.
    @discardableResult
    func stop(_ signal: Int32, timeout: Duration = .seconds(15)) -> Bool {
        guard process.isRunning else { return true }
        kill(pid, signal)
        let deadline = ContinuousClock.now + timeout
        while process.isRunning && ContinuousClock.now < deadline { usleep(10_000) }
        let inTime = !process.isRunning
        if !inTime { kill(pid, SIGKILL) }
        process.waitUntilExit()
        return inTime
    }
}

/// `peersync status --json`, the parts the month needs.
struct MonthStatus: Decodable {
    struct Compaction: Decodable { var deletedRecords: Int; var purgedRecords: Int; var summary: String? }
    struct Node: Decodable {
        struct Peer: Decodable { var replicaID: String }
        struct Health: Decodable { var repairs: Int }
        var pid: Int32
        var peers: [Peer]
        var health: Health?
    }
    var replicaID: String
    var deviceID: String
    var role: String
    var digest: String
    var records: [String: Int]
    var compaction: Compaction
    var node: Node?
}

/// `peersync devices list --json`, one entry.
struct MonthDevice: Decodable, Hashable {
    var deviceID: String
    var name: String
    var role: String
    var removed: Bool
}

/// Carries a `MonthScript` out with real `peersync` processes on 127.0.0.1 (static `--peer`s,
/// no discovery), each device in its own store directory, and collects what went wrong on the
/// way; `MonthOracle` judges the end.
final class MonthRunner: @unchecked Sendable {
    let script: MonthScript
    let root: String
    let directories: [String]
    let ports: [Int]
    private(set) var nodes: [Int: NodeProcess] = [:]
    /// Record number → the ID `add` printed.
    private(set) var ids: [Int: String] = [:]
    private var codes: [Int: String] = [:]
    private var runCount = 0
    /// Every node run's log: device, log file.
    private(set) var logs: [(device: Int, path: String)] = []
    /// Replica ID (32 hex) → device, as `status` showed them.
    private(set) var owners: [String: Int] = [:]
    /// When each restore happened (wall clock, to match log lines).
    private(set) var restoredAt: [(device: Int, number: Int, at: Date)] = []
    /// The watchdog's repair count of each node run, as last seen in `status`.
    private var repairsSeen: [Int32: (device: Int, repairs: Int)] = [:]
    /// Problems seen during the month, by kind.
    private(set) var problems: [String: [String]] = [:]
    private(set) var day = 0
    /// When each day began (wall clock, to place log lines).
    private(set) var dayStarted: [Date] = []
    /// Bound of a day-end convergence wait; shorter once the group has split (it only matters then).
    private var convergeTimeout: Duration = .seconds(60)

    init(_ script: MonthScript) throws {
        self.script = script
        let root = try makeTemporaryDirectory("peersync-month-\(script.seed)")
        let directories = (0..<MonthScript.devices).map { "\(root)/d\($0)" }
        for directory in directories { try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true) }
        (self.root, self.directories) = (root, directories)
        ports = try Self.freePorts(MonthScript.devices)
    }

    /// Stops every node still running (SIGTERM, then SIGKILL).
    func stopAll() {
        for (device, node) in nodes.sorted(by: { $0.key < $1.key }) {
            sample(device)
            node.stop(SIGTERM)
        }
        nodes = [:]
    }

    func removeFiles() { removeTemporaryDirectory(root) }

    func note(_ kind: String, _ text: String) { problems[kind, default: []].append("day \(day): \(text)") }

    // MARK: Running the script

    func run() async throws {
        try script.transcript.write(toFile: "\(root)/script.txt", atomically: true, encoding: .utf8)
        for day in script.days {
            self.day = day.number
            dayStarted.append(Date())
            for action in day.actions { try await perform(action) }
        }
    }

    func perform(_ action: MonthScript.Action) async throws {
        switch action {
        case .create(let device):
            try require(cli(device, ["init", "--name", "d\(device)"]), "init d\(device)")
        case .invite(let admin, let role, let device):
            let result = try cli(admin, ["invite", "--role", role])
            try require(result, "invite on d\(admin)")
            codes[device] = result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        case .join(let device):
            try require(cli(device, ["init", "--name", "d\(device)", "--join", codes[device] ?? ""]), "init --join d\(device)")
        case .start(let device):
            try await start(device)
        case .stop(let device):
            sample(device)
            if nodes.removeValue(forKey: device)?.stop(SIGTERM) == false { note("stops", "d\(device)'s node did not stop within 15 s of SIGTERM") }
        case .op(let index):
            try operate(script.model.ops[index])
        case .kill(let device, let delay):
            guard let node = nodes[device] else { return note("script", "kill of d\(device), which is not running") }
            // A random instant in what the node is doing (not a synchronisation).
            try? await Task.sleep(for: .milliseconds(delay))
            sample(device)
            node.stop(SIGKILL)
            nodes[device] = nil
            try await start(device)
        case .compact(let device):
            let result = try cli(device, ["compact", "--json"])
            if result.status != 0 { note("commands", "d\(device) compact: \(result.stderr.trimmed)") }
        case .backup(let device):
            precondition(nodes[device] == nil)
            try shell(["/bin/cp", "-a", directories[device], "\(root)/backup-d\(device)"])
        case .restore(let device, let inPlace, let number):
            precondition(nodes[device] == nil)
            try restore(device, inPlace: inPlace)
            restoredAt.append((device, number, Date()))
        case .remove(let admin, let device):
            try await remove(device, by: admin)
        case .converge(let devices):
            await converge(devices)
        case .awaitPurge(let devices):
            let purged = await eventually(timeout: .seconds(30), every: .milliseconds(300)) {
                devices.allSatisfy { (status($0)?.compaction.deletedRecords ?? 1) == 0 }
            }
            if !purged {
                let left = devices.map { "d\($0): \(status($0).map { "\($0.compaction.deletedRecords) (\($0.compaction.summary ?? ""))" } ?? "?")" }
                note("purge", "deleted records not purged within 30 s with everyone online: \(left.joined(separator: ", "))")
            }
        }
    }

    // MARK: Devices

    func cli(_ device: Int, _ arguments: [String]) throws -> CommandResult {
        try runCommand(Nodes.binary, arguments + ["--store", directories[device]])
    }

    func status(_ device: Int) -> MonthStatus? {
        guard let result = try? cli(device, ["status", "--json"]), result.status == 0,
              let status = try? JSONDecoder().decode(MonthStatus.self, from: Data(result.stdout.utf8)) else { return nil }
        owners[status.replicaID] = device
        if let node = status.node, let health = node.health { repairsSeen[node.pid] = (device, health.repairs) }
        return status
    }

    /// Reads the running node's status (its replica ID and repair count) before it stops.
    private func sample(_ device: Int) { _ = status(device) }

    /// The sum over every node run of its watchdog repairs, as `status` last showed them.
    var repairsFromStatus: [Int: Int] {
        repairsSeen.values.reduce(into: [:]) { $0[$1.device, default: 0] += $1.repairs }
    }

    private func require(_ result: CommandResult, _ what: String) throws {
        try #require(result.status == 0, "\(what) failed: \(result.stderr.trimmed)")
    }

    private func start(_ device: Int) async throws {
        runCount += 1
        let log = "\(root)/d\(device)-run\(runCount)-day\(day).log"
        let peers = (0..<MonthScript.devices).filter { $0 != device }.flatMap { ["--peer", "127.0.0.1:\(ports[$0])"] }
        let node = try NodeProcess(device: device, arguments: ["run", "--store", directories[device], "--listen", "127.0.0.1:\(ports[device])",
                                                               "--no-discovery", "--log-level", "info"] + peers, log: log)
        nodes[device] = node
        logs.append((device, log))
        let up = await eventually(timeout: .seconds(30), every: .milliseconds(50)) {
            !node.process.isRunning || status(device)?.node?.pid == node.pid
        }
        if !up || !node.process.isRunning {
            let tail = (try? String(contentsOfFile: log, encoding: .utf8))?.split(separator: "\n").suffix(3).joined(separator: " | ") ?? ""
            note("starts", "d\(device)'s node did not come up: \(tail)")
        }
    }

    /// Waits until the devices' digests are equal; notes the digests and counts if they never are.
    func converge(_ devices: [Int]) async {
        guard devices.count > 1 else { return }
        let started = ContinuousClock.now
        var last: [Int: MonthStatus] = [:]
        let equal = await eventually(timeout: convergeTimeout, every: .milliseconds(200)) {
            last = [:]
            for device in devices { last[device] = status(device) }
            return last.count == devices.count && Set(last.values.map(\.digest)).count == 1
        }
        if equal { return }
        convergeTimeout = .seconds(20)
        let detail = devices.map { d in
            last[d].map { "d\(d) \($0.digest.prefix(8)) \($0.records["locations"] ?? 0)L/\($0.records["shiftTypes"] ?? 0)S" } ?? "d\(d) ?"
        }
        note("convergence", "\(devices.map { "d\($0)" }.joined(separator: ",")) not converged after "
             + "\(Int((ContinuousClock.now - started).components.seconds)) s: \(detail.joined(separator: "; "))")
    }

    private func remove(_ device: Int, by admin: Int) async throws {
        let list = try cli(device, ["devices", "list", "--json"])
        let listed = try JSONSerialization.jsonObject(with: Data(list.stdout.utf8)) as? [[String: Any]] ?? []
        let id = try #require(listed.first { $0["thisDevice"] as? Bool == true }?["deviceID"] as? String, "\(list.stdout)")
        try require(cli(admin, ["devices", "remove", id]), "devices remove on d\(admin)")
        let replicas = Set(owners.filter { $0.value == device }.keys)
        let members = script.active.filter { nodes[$0] != nil }
        // Every member knows, and no node keeps a session with the removed device.
        let done = await eventually(timeout: .seconds(30), every: .milliseconds(200)) {
            members.allSatisfy { m in
                let roster = (try? cli(m, ["devices", "list", "--json"])).flatMap { try? JSONDecoder().decode([MonthDevice].self, from: Data($0.stdout.utf8)) }
                let knows = roster?.contains { $0.deviceID == id && $0.removed } ?? false
                let connected = status(m)?.node?.peers.contains { replicas.contains($0.replicaID) } ?? true
                return knows && !connected
            } && (status(device)?.node?.peers.isEmpty ?? true)
        }
        if !done { note("removal", "not every member refuses d\(device) within 30 s of its removal") }
    }

    /// Puts the backup back: `rm -rf dir; cp -a backup dir`, or written over the existing files
    /// (same inodes; files the backup lacks are removed).
    private func restore(_ device: Int, inPlace: Bool) throws {
        let (directory, backup) = (directories[device], "\(root)/backup-d\(device)")
        guard inPlace else {
            try shell(["/bin/rm", "-rf", directory])
            try shell(["/bin/cp", "-a", backup, directory])
            return
        }
        let saved = Set(try FileManager.default.contentsOfDirectory(atPath: backup))
        for file in try FileManager.default.contentsOfDirectory(atPath: directory) where !saved.contains(file) {
            try FileManager.default.removeItem(atPath: "\(directory)/\(file)")
        }
        for file in saved {
            let bytes = try #require(FileManager.default.contents(atPath: "\(backup)/\(file)"))
            let target = "\(directory)/\(file)"
            if let handle = FileHandle(forUpdatingAtPath: target) {
                try handle.truncate(atOffset: 0)
                try handle.write(contentsOf: bytes)
                try handle.close()
            } else {
                try shell(["/bin/cp", "-a", "\(backup)/\(file)", target])
            }
        }
    }

    private func shell(_ arguments: [String]) throws {
        let result = try runCommand(arguments[0], Array(arguments.dropFirst()))
        try #require(result.status == 0, "\(arguments.joined(separator: " ")): \(result.stderr.trimmed)")
    }

    // MARK: Operations

    /// One model operation as a CLI command on the device's store; an add records the printed ID.
    private func operate(_ op: MonthModel.Op) throws {
        let kind = script.model.records[op.record].kind
        let noun = kind == .location ? "location" : "shift-type"
        var arguments: [String]
        switch op.kind {
        case .add:
            arguments = [noun, "add"]
        case .set, .delete:
            guard let id = ids[op.record] else { return note("edits refused", "d\(op.device): \(op.kind) of record \(op.record), whose add failed") }
            arguments = [noun, op.kind == .set ? "set" : "rm", id]
        }
        for (field, value) in op.fields.sorted(by: { $0.key < $1.key }) {
            switch (field, value) {
            case (.description, .text("")) where op.kind == .add: continue  // the default
            case (.locationID, .reference(nil)):
                if op.kind == .set { arguments += ["--location", "none"] }
            case (.locationID, .reference(let location?)):
                arguments += ["--location", ids[location] ?? "missing-L\(location)"]
            case (_, .text(let text)): arguments += ["--\(field.rawValue)", text]
            case (_, .seconds(let seconds)): arguments += ["--\(field.rawValue)", "\(seconds)"]
            default: break
            }
        }
        let result = try cli(op.device, arguments)
        guard result.status == 0 else {
            // The device lacks a record the model says it holds: an earlier failure, or a bug.
            return note("edits refused", "d\(op.device) `\(arguments.prefix(2).joined(separator: " ")) \(op.record)` (\(op.label)) failed: \(result.stderr.trimmed)")
        }
        if op.kind == .add { ids[op.record] = result.stdout.trimmed }
    }

    // MARK: The end

    /// What the device shows: its records (by `export`), digest, role and roster.
    func observe(_ device: Int) throws -> MonthOracle.Observation {
        let byID = Dictionary(ids.map { ($0.value, $0.key) }, uniquingKeysWith: { a, _ in a })
        var state = ObservedState()
        let exported = try cli(device, ["export"])
        let json = try JSONSerialization.jsonObject(with: Data(exported.stdout.utf8)) as? [String: Any]
        let collections = json?["collections"] as? [String: Any] ?? [:]
        for (collection, kind) in [("locations", MonthModel.Kind.location), ("shiftTypes", .shiftType)] {
            for object in collections[collection] as? [[String: Any]] ?? [] {
                let id = object["id"] as? String ?? "?"
                guard let record = byID[id] else {
                    state.unknown.append("\(collection)/\(id)")
                    continue
                }
                var fields: [MonthModel.Field: MonthModel.Value] = [:]
                for field in MonthModel.Field.of(kind) {
                    guard let value = object[field.rawValue] else { continue }
                    switch field {
                    case .duration: fields[field] = (value as? NSNumber).map { .seconds($0.intValue) } ?? .text("\(value)")
                    case .locationID:
                        if value is NSNull { fields[field] = .reference(nil) } else {
                            let text = value as? String ?? "\(value)"
                            fields[field] = byID[text].map { .reference($0) } ?? .text("unknown \(text)")
                        }
                    default: fields[field] = .text(value as? String ?? "\(value)")
                    }
                }
                state.records[record] = fields
            }
        }
        let status = status(device)
        let roster = (try? cli(device, ["devices", "list", "--json"])).flatMap {
            try? JSONDecoder().decode([MonthDevice].self, from: Data($0.stdout.utf8))
        } ?? []
        return MonthOracle.Observation(device: device, state: state, digest: status?.digest, role: status?.role, roster: roster)
    }

    /// Every node run's log, by device (read once the nodes stopped).
    func logTexts() -> [(device: Int, text: String)] {
        logs.map { ($0.device, (try? String(contentsOfFile: $0.path, encoding: .utf8)) ?? "") }
    }

    // MARK: Ports

    /// Ports below the ephemeral range that are free now (so restarts can reuse them).
    static func freePorts(_ count: Int) throws -> [Int] {
        var ports: [Int] = []
        var candidate = 20_000 + Int(getpid() % 500) * 20
        while ports.count < count && candidate < 32_000 {
            if isFree(candidate) { ports.append(candidate) }
            candidate += 1
        }
        try #require(ports.count == count, "no free ports")
        return ports
    }

    private static func isFree(_ port: Int) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
    }
}

extension String {
    var trimmed: String { trimmingCharacters(in: .whitespacesAndNewlines) }
}
