import Foundation
import Logging
import PeerSync
import ShiftSchedulerModel

// What an app's view model does: observe the change stream (local, peer and other-process
// changes) and the status stream (disabled → connecting → syncing → in sync), while a second
// device edits. Bounded: it stops after it has seen what it waits for, or after 20 seconds.

let root = FileManager.default.temporaryDirectory.appendingPathComponent("app-streams-\(UUID().uuidString)").path
defer { try? FileManager.default.removeItem(atPath: root) }
var logger = Logger(label: "example")
logger.logLevel = .warning  // apps choose their logging; the library only logs through what it is given
let app = try Replica.create(at: root + "/app", name: "app", logger: logger)
let other = try Replica.join(at: root + "/other", name: "other device", invite: try await app.invite(), logger: logger)

let statusLog = Task {
    var seen: [String] = []
    for await status in app.statusUpdates() {
        let text: String = switch status {
        case .disabled: "disabled"
        case .connecting: "connecting"
        case .syncing(let progress): "syncing" + (progress.map { String(format: " %.0f%%", $0 * 100) } ?? "")
        case .inSync(_, let peers): "in sync with \(peers.joined(separator: ", "))"
        case .error(let reason): "error: \(reason)"
        }
        if seen.last != text { print("status:", text) }
        seen.append(text)
        if text.hasPrefix("in sync") { return seen }
    }
    return seen
}
let changeLog = Task {
    var fromPeer = 0
    for await change in app.changes() {
        print("change from \(change.origin): \(change.records.map(\.description).sorted())")
        if case .peer = change.origin { fromPeer += change.records.count }
        if fromPeer >= 2 { return fromPeer }
    }
    return fromPeer
}

try await app.save(Location(name: "Made offline, before sync was on"))
let loopback = PeerAddress(host: "127.0.0.1", port: 0)
let port = try await app.startSync(SyncConfiguration(security: .tls, listen: loopback))
try await other.startSync(SyncConfiguration(security: .tls, listen: loopback,
                                            peers: [PeerAddress(host: "127.0.0.1", port: port)]))
try await other.save(ShiftType(symbol: "L", title: "Late", duration: 8 * 3600))
try await other.save(Location(name: "Depot"))

let timeout = Task {
    try await Task.sleep(for: .seconds(20))
    print("timed out")
    exit(1)
}
let statuses = await statusLog.value
let peerChanges = await changeLog.value
timeout.cancel()
print("saw \(peerChanges) records changed by the peer; statuses: \(statuses.joined(separator: " → "))")
await app.stopSync()
await other.stopSync()
print("the offline location reached the other device:", try other.fetchAll(Location.self).contains { $0.name.hasPrefix("Made offline") })
