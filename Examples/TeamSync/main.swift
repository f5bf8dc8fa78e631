import Foundation
import PeerSync
import Synchronization

// Two devices of a shift-planning app, through the sync layer in SyncLayer.swift: Anna used
// the app alone first and joins the office's team with her data; a live list of this week's
// shifts; a conflict; a photo; a lost phone removed. Run: swift run example-team-sync

func check(_ condition: Bool, _ what: String) {
    guard condition else { print("FAILED: \(what)"); exit(1) }
    print("ok: \(what)")
}

/// Waits (at most 20 s) until `condition` holds.
func eventually(_ condition: () async throws -> Bool) async rethrows -> Bool {
    for _ in 0..<400 {
        if try await condition() { return true }
        try? await Task.sleep(for: .milliseconds(50))
    }
    return false
}

let root = FileManager.default.temporaryDirectory.appendingPathComponent("peersync-team-\(UUID().uuidString)").path
defer { try? FileManager.default.removeItem(atPath: root) }
let office = try SyncLayer(path: root + "/office", name: "office")
let ward = Place(name: "Ward 3")
try await office.replica.save(ward)
let night = Shift(start: Date(), assignee: "")
try await office.replica.save(night)
let oldPhone = try SyncLayer(path: root + "/old-phone", name: "old phone")
try await oldPhone.join(try await office.invite())

let anna = try SyncLayer(path: root + "/anna", name: "Anna's iPad")
try await anna.replica.save(Shift(start: Date(), assignee: "Anna"))  // alone, before the team
try await anna.join(try await office.invite())
let port = try await office.setSync(true)
_ = try await anna.setSync(true, peer: port)
_ = try await oldPhone.setSync(true, peer: port)

let week = Locked<[Shift]>([])
let watcher = Task { for try await shifts in anna.thisWeek(await anna.replica) { week.set(shifts) } }
check(await eventually { week.get().count == 2 }, "Anna's live week list shows her shift and the team's")

_ = try await office.setSync(false)
_ = try await anna.setSync(false)
try await anna.assign(night.id, to: "Anna")
try await office.assign(night.id, to: "Ben")
let newPort = try await office.setSync(true)  // a new listening port
_ = try await anna.setSync(true, peer: newPort)
check(try await eventually { !(try await office.conflictLines() + anna.conflictLines()).isEmpty }, "the concurrent assignment is a conflict")
for line in try await office.conflictLines() + anna.conflictLines() { print("   \(line)") }

try await office.setPhoto(Data(repeating: 0xFF, count: 200_000), of: ward.id)
let photo = try await eventually { try await anna.replica.fetch(Place.self, id: ward.id)?.photo != nil }
let arrived = try await eventually {
    guard let photo = try await anna.replica.fetch(Place.self, id: ward.id)?.photo else { return false }
    if case .available = await anna.replica.attachmentAvailability(for: photo) { return true }
    return false
}
check(photo && arrived, "the ward's photo reached Anna's iPad")

try await office.removeLostDevice(named: "old phone")
check(await eventually { await anna.replica.roster().activeDevices.map(\.name).sorted() == ["Anna's iPad", "office"] },
      "the lost phone is removed everywhere")
watcher.cancel()
for layer in [office, anna, oldPhone] { await layer.close() }

/// A value shared with the watcher task.
final class Locked<Value: Sendable>: Sendable {
    private let value: Mutex<Value>
    init(_ value: Value) { self.value = Mutex(value) }
    func get() -> Value { value.withLock { $0 } }
    func set(_ new: Value) { value.withLock { $0 = new } }
}
