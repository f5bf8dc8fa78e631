import Foundation
import Logging
import Observation
import PeerSync
import ShiftSchedulerModel

// A headless SwiftUI-style app. Two devices sync over 127.0.0.1 (real TLS, real SQLite files):
// the front desk edits shift types; the ward tablet shows them through a `ReplicaModel`, the
// `@Observable` class an app keeps in its view model. `render()` plays the view's `body`: it
// reads the model, and is called again whenever something it read changes — the way SwiftUI
// redraws, through `withObservationTracking`. Exits 0 when the tablet has shown every step,
// 1 if a step does not show up within 20 s, 2 if the whole run takes over 90 s.

struct ExampleError: Error, CustomStringConvertible {
    let description: String
}

@MainActor
final class TabletScreen {
    let model: ReplicaModel<ShiftType>
    private(set) var renders = 0

    init(model: ReplicaModel<ShiftType>) {
        self.model = model
    }

    /// The view's body: what the screen shows, from the model alone.
    func render() {
        withObservationTracking {
            renders += 1
            let status = switch model.status {
            case .disabled: "sync off"
            case .connecting: "looking for peers"
            case .syncing: "syncing"
            case .inSync(_, let peers): "in sync with \(peers.joined(separator: ", "))"
            case .error(let reason): "error: \(reason)"
            }
            let rows = model.records.map { "\($0.symbol) \($0.title) (\(Int($0.duration / 3600)) h)" }
            print("  [tablet render \(renders)] \(status); peers: \(model.peers.map(\.info.name)); "
                  + "conflicts: \(model.conflicts.count); shift types: \(rows)")
        } onChange: {
            // Called before the change lands; draw again on the main actor right after it, as SwiftUI does.
            Task { @MainActor in self.render() }
        }
    }

    /// Waits (on the main actor, never blocking it) until the screen shows what `condition` wants.
    func waitUntil(_ what: String, _ condition: () -> Bool) async throws {
        let deadline = ContinuousClock.now + .seconds(20)
        while !condition() {
            guard ContinuousClock.now < deadline else { throw ExampleError(description: "the tablet never showed \(what)") }
            try await Task.sleep(for: .milliseconds(10))
        }
        print("tablet shows \(what)")
    }
}

let watchdog = Task.detached {
    try await Task.sleep(for: .seconds(90))
    FileHandle.standardError.write(Data("example-observable-app: timed out\n".utf8))
    exit(2)
}

let root = FileManager.default.temporaryDirectory.appendingPathComponent("observable-app-\(UUID().uuidString)").path
var logger = Logger(label: "example")
logger.logLevel = .warning
do {
    defer { try? FileManager.default.removeItem(atPath: root) }
    let desk = try Replica.create(at: root + "/desk", name: "Front desk", logger: logger)
    let tablet = try Replica.join(at: root + "/tablet", name: "Ward tablet", invite: try await desk.invite(), logger: logger)
    let port = try await desk.startSync(SyncConfiguration(security: .tls, listen: .loopback(0)))
    try await tablet.startSync(SyncConfiguration(security: .tls, listen: .loopback(0), peers: [.loopback(port)]))

    let screen = TabletScreen(model: ReplicaModel(replica: tablet, sortedBy: [KeyPathComparator(\ShiftType.title)]))
    screen.render()
    try await screen.waitUntil("the desk as a peer") { screen.model.peers.map(\.info.name) == ["Front desk"] }

    print("desk: adds Early, Late and Night")
    let ward = Location(name: "Ward 3")
    try await desk.batch { b in
        try b.save(ward)
        try b.save(ShiftType(symbol: "E", title: "Early", duration: 8 * 3600, locationID: ward.id))
        try b.save(ShiftType(symbol: "L", title: "Late", duration: 8 * 3600, locationID: ward.id))
        try b.save(ShiftType(symbol: "N", title: "Night", duration: 10 * 3600))
    }
    try await screen.waitUntil("three shift types") { screen.model.records.map(\.symbol) == ["E", "L", "N"] }

    print("desk: renames Late to Afternoon")
    var late = try desk.fetchAll(ShiftType.self, where: { $0.symbol == "L" })[0]
    late.title = "Afternoon"
    try await desk.save(late)
    try await screen.waitUntil("the rename, re-sorted") { screen.model.records.map(\.title) == ["Afternoon", "Early", "Night"] }

    print("desk: in one batch, deletes Night and the ward, adds Weekend")
    let night = try desk.fetchAll(ShiftType.self, where: { $0.symbol == "N" })[0]
    try await desk.batch { b in
        try b.delete(night)
        try b.delete(ward)
        try b.save(ShiftType(symbol: "W", title: "Weekend", duration: 12 * 3600))
    }
    try await screen.waitUntil("the batch, whole, with the ward's shift types now without a location") {
        screen.model.records.map(\.title) == ["Afternoon", "Early", "Weekend"]
            && screen.model.records.allSatisfy { $0.locationID == nil }
    }

    let renders = screen.renders
    screen.model.stop()
    await desk.stopSync()
    await tablet.stopSync()
    watchdog.cancel()
    print("ok: the tablet's screen followed every step (\(renders) renders)")
} catch {
    FileHandle.standardError.write(Data("example-observable-app: \(error)\n".utf8))
    exit(1)
}
