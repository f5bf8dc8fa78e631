import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncNetwork
import PeerSyncRelay
import PeerSyncReplication
import PeerSyncSeal
import PeerSyncWire
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Issue 33's scale figure: one `peersync relay` process with 1,000 connected devices in 200
/// groups (five each) at 200 edits/s in all, over real TLS on 127.0.0.1. Each device is a
/// lightweight protocol client (this process seals, signs and uploads one edit's delta, as a
/// device's relay session does, and times its arrival at the group's four other devices); the
/// relay is the real one, in its own process, so its RSS and CPU are its own. Also: the bytes a
/// relay adds per edit over a direct session (frame sizes of the same delta both ways).
enum RelayScaleBenchmark {
    static let scale = Benchmark(name: "relay-scale") { quick in try await run(quick: quick) }

    struct Device: Sendable {
        let key: DeviceKey
        let replica: ReplicaID
        let group: Int
    }

    /// Shared by the device clients: writers once connected, send instants, latencies.
    final class Board: Sendable {
        struct State {
            var writers: [Int: RelayDial.Writer] = [:]
            var welcomed = 0
            var sent: [Dot: ContinuousClock.Instant] = [:]
            var latencies: [Double] = []
            var received = 0
            var refusals: [String] = []
        }
        let state = Mutex(State())
    }

    static func run(quick: Bool) async throws -> Result {
        let groups = quick ? 4 : 200
        let perGroup = quick ? 3 : 5
        let seconds = quick ? 2.0 : 30.0
        let rate = quick ? 20.0 : 200.0
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("relay-scale-\(UUID().uuidString)").path
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (relay, port, code) = try startRelay(directory)
        defer { stopProcess(relay) }
        let address = PeerAddress(host: "127.0.0.1", port: UInt16(port))

        var rng = BenchRNG(state: 33)
        let devices = (0..<groups * perGroup).map { index in
            Device(key: .generate(), replica: ReplicaID.random(using: &rng), group: index / perGroup)
        }
        let groupIDs = (0..<groups).map { _ in GroupID(bytes: (0..<16).map { _ in UInt8.random(in: 0...255, using: &rng) })! }
        let dataKeys = (0..<groups).map { _ in DataKey.generate(epoch: 0) }
        // The relay's key, for the member lists.
        let relayKey = try await RelayDial.run(address, key: .generate(), expecting: code.relay) { key, _, writer in
            writer.close()
            return key
        }
        let board = Board()
        let clients = Task {
            await withTaskGroup(of: Void.self) { tasks in
                for (index, device) in devices.enumerated() {
                    let first = index % perGroup == 0
                    var list: [DevicePublicKey: DeviceRole] = [relayKey: .relay]
                    for member in devices[(device.group * perGroup)..<((device.group + 1) * perGroup)] {
                        list[member.key.publicKey] = member.replica == devices[device.group * perGroup].replica ? .admin : .member
                    }
                    let members = first ? RelayMembers.sign(group: groupIDs[device.group], sequence: 1, members: list, by: device.key) : nil
                    tasks.addTask {
                        await client(index, device, group: groupIDs[device.group], members: members,
                                     secret: first ? code.secret : nil, address: address, board: board, waitForAdmin: !first,
                                     adminIndex: device.group * perGroup)
                    }
                }
            }
        }
        // Everyone welcomed (bounded).
        let deadline = ContinuousClock.now + .seconds(120)
        while board.state.withLock({ $0.welcomed }) < devices.count, ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(50)) }
        let welcomed = board.state.withLock { $0.welcomed }
        guard welcomed == devices.count else {
            clients.cancel()
            let refusals = board.state.withLock { $0.refusals.prefix(3) }
            throw BenchmarkFailure("relay-scale: \(welcomed) of \(devices.count) devices welcomed; \(refusals)")
        }
        let rssConnected = residentKilobytes(relay.processIdentifier) ?? 0
        let cpuBefore = cpuSeconds(relay.processIdentifier)
        let started = ContinuousClock.now

        // The edits: round-robin over groups, a random device of each, at `rate` per second.
        let edits = Int(seconds * rate)
        var states: [ReplicaID: RecordMap] = [:]
        var clock = HybridLogicalClock(latest: .zero)
        var uploadBytes = 0
        var directBytes = 0
        for edit in 0..<edits {
            let due = started + .milliseconds(Int64(Double(edit) * 1_000 / rate))
            let wait = due - ContinuousClock.now
            if wait > .zero { try await Task.sleep(for: wait) }
            let group = edit % groups
            let index = group * perGroup + Int.random(in: 0..<perGroup, using: &rng)
            let device = devices[index]
            var fields = shiftFields(edit, &rng)
            fields["title"] = .string("Edit \(edit)")
            let delta = try states[device.replica, default: RecordMap()].write(fields, to: RecordKey(collection: "shiftTypes", id: UUID()),
                                                                                at: clock.tick(), by: device.replica)
            let counter = delta.context.maxCounter(of: device.replica)
            let base = delta.maxTimestamp.physicalMilliseconds
            var plaintext: [UInt8] = []
            Varint.append(base, to: &plaintext)
            plaintext += WireDelta.encode(records: delta.allRecords, context: delta.context, with: WireDictionary(startingAt: base))
            let blob = try SealedBlob.seal(plaintext, group: groupIDs[group], key: dataKeys[group], writer: device.key,
                                           replica: device.replica, counters: counter...counter, head: counter)
            let frame = RelayMessage.upload(blob).frame
            uploadBytes += frame.count
            directBytes += Message.delta(WireDelta.encode(delta, with: WireDictionary(startingAt: base))).encodedFrame().count
            guard let writer = board.state.withLock({ state -> RelayDial.Writer? in
                state.sent[Dot(replica: device.replica, counter: counter)] = .now
                return state.writers[index]
            }) else { continue }
            try? await writer.write(frame)
        }
        // Arrivals (bounded).
        let expected = edits * (perGroup - 1)
        let drain = ContinuousClock.now + .seconds(10)
        while board.state.withLock({ $0.received }) < expected, ContinuousClock.now < drain { try await Task.sleep(for: .milliseconds(20)) }
        let elapsed = milliseconds(ContinuousClock.now - started) / 1_000
        let cpu = cpuSeconds(relay.processIdentifier) - cpuBefore
        let rssAfter = residentKilobytes(relay.processIdentifier) ?? 0
        let peak = peakKilobytes(relay.processIdentifier) ?? 0
        clients.cancel()
        await clients.value
        let (latencies, received) = board.state.withLock { ($0.latencies.sorted(), $0.received) }
        func percentile(_ p: Double) -> Double { latencies.isEmpty ? .nan : latencies[min(latencies.count - 1, Int(Double(latencies.count) * p))] }
        let perEditUpload = Double(uploadBytes) / Double(max(edits, 1))
        let perEditDirect = Double(directBytes) / Double(max(edits, 1))
        return Result(
            name: "relay-scale",
            detail: "one relay process, \(devices.count) devices in \(groups) groups over TLS on 127.0.0.1, \(edits) edits at \(Int(rate))/s; "
                + "\(received)/\(expected) arrivals; relay CPU \(String(format: "%.1f", cpu)) s in \(String(format: "%.1f", elapsed)) s; "
                + "frames: upload \(Int(perEditUpload)) B vs direct delta \(Int(perEditDirect)) B per edit",
            metrics: [
                "p50_ms": percentile(0.5), "p99_ms": percentile(0.99), "max_ms": latencies.last ?? .nan,
                "relay_rss_mb": Double(rssAfter) / 1024, "relay_rss_connected_mb": Double(rssConnected) / 1024,
                "relay_peak_rss_mb": Double(peak) / 1024, "relay_cpu_percent": cpu / max(elapsed, 0.001) * 100,
                "arrivals_fraction": Double(received) / Double(max(expected, 1)),
                "upload_frame_bytes": perEditUpload, "direct_delta_frame_bytes": perEditDirect,
                "relay_adds_bytes_per_hop": perEditUpload - perEditDirect,
            ])
    }

    /// One device's session: hello (the group's admin enrols it), want, then every blob that
    /// arrives is timed against its send instant.
    static func client(_ index: Int, _ device: Device, group: GroupID, members: RelayMembers?, secret: [UInt8]?, address: PeerAddress,
                       board: Board, waitForAdmin: Bool, adminIndex: Int) async {
        if waitForAdmin {
            // The group exists once its admin was welcomed.
            let deadline = ContinuousClock.now + .seconds(120)
            while board.state.withLock({ $0.writers[adminIndex] == nil }), ContinuousClock.now < deadline {
                try? await Task.sleep(for: .milliseconds(20))
            }
        }
        do {
            try await RelayDial.run(address, key: device.key, expecting: nil) { _, reader, writer in
                try await writer.write(RelayMessage.hello(group: group, members: members, enrolSecret: secret).frame)
                while let frames = try await reader.next() {
                    let now = ContinuousClock.now
                    for frame in frames {
                        switch try RelayMessage.decode(type: frame.type, body: frame.body) {
                        case .welcome:
                            board.state.withLock { state in
                                state.writers[index] = writer
                                state.welcomed += 1
                            }
                        case .blob(let blob):
                            board.state.withLock { state in
                                guard let sent = state.sent[Dot(replica: blob.replica, counter: blob.lastCounter)] else { return }
                                state.latencies.append(milliseconds(now - sent))
                                state.received += 1
                            }
                        case .refused(let reason, let text):
                            board.state.withLock { $0.refusals.append("\(reason): \(text)") }
                            return
                        case .ping(let nonce):
                            try await writer.write(RelayMessage.pong(nonce).frame)
                        default:
                            break
                        }
                    }
                }
            }
        } catch {
            board.state.withLock { $0.refusals.append("\(error)") }
        }
    }

    static func startRelay(_ directory: String) throws -> (Process, Int, RelayCode) {
        let process = Process()
        process.executableURL = peersyncTool
        process.arguments = ["relay", "serve", "--store", directory, "--listen", "127.0.0.1:0", "--log-level", "error",
                             "--max-connections-per-address", "4096"]  // every simulated device is on 127.0.0.1
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        var text = ""
        let deadline = ContinuousClock.now + .seconds(20)
        let handle = output.fileHandleForReading
        while !text.contains("PSL-") || !text.hasSuffix("\n"), ContinuousClock.now < deadline, process.isRunning {
            let data = handle.availableData
            if data.isEmpty { break }
            text += String(decoding: data, as: UTF8.self)
        }
        guard let first = text.split(separator: "\n").first, let port = first.split(separator: ":").last.flatMap({ Int($0) }),
              let range = text.range(of: "PSL-"), let line = text[range.lowerBound...].split(separator: "\n").first,
              let code = try? RelayCode(parsing: String(line)) else {
            stopProcess(process)
            throw BenchmarkFailure("relay-scale: the relay did not start (\(text))")
        }
        return (process, port, code)
    }

    static func residentKilobytes(_ pid: Int32) -> Int? { statusField(pid, "VmRSS:") }
    static func peakKilobytes(_ pid: Int32) -> Int? { statusField(pid, "VmHWM:") }

    static func statusField(_ pid: Int32, _ field: String) -> Int? {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = status.split(separator: "\n").first(where: { $0.hasPrefix(field) }) else { return nil }
        return Int(line.split(separator: " ").dropFirst().first ?? "")
    }

    /// utime + stime of `pid`, in seconds.
    static func cpuSeconds(_ pid: Int32) -> Double {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = stat.lastIndex(of: ")") else { return 0 }
        let fields = stat[stat.index(after: close)...].split(separator: " ")
        // Fields after the command: state is [0], utime [11], stime [12].
        guard fields.count > 12, let user = Double(fields[11]), let system = Double(fields[12]) else { return 0 }
        return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
    }
}
