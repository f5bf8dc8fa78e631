import Foundation
import PeerSync

// Settings come in two scopes: synced (every device of the group, last writer wins per key)
// and local (this device only: window sizes, power mode). This example shows both on two
// replicas in one process, exchanging deltas by hand — no network needed to see the rules.

let root = FileManager.default.temporaryDirectory.appendingPathComponent("settings-\(UUID().uuidString)").path
defer { try? FileManager.default.removeItem(atPath: root) }
let laptop = try ReplicaStore.create(directory: root + "/laptop", name: "laptop")
let phone = try ReplicaStore.create(directory: root + "/phone", name: "phone")

// Each change returns the delta to ship; here we hand it over directly.
func ship(_ delta: RecordMap?, to store: ReplicaStore) throws {
    if let delta { try store.applyRemote(delta, from: "example") }
}

try ship(try laptop.write { $0.setSetting(SettingKey.weekStart, to: 1, scope: .synced) }, to: phone)
try ship(try laptop.write { $0.setSetting(SettingKey.retentionDays, to: 90, scope: .synced) }, to: phone)
try ship(try laptop.write { $0.setSetting("windowWidth", to: 1280, scope: .local) }, to: phone)  // nil: nothing to ship
try ship(try phone.write { $0.setSetting(SettingKey.powerMode, to: "low", scope: .local) }, to: laptop)

// Both change weekStart while apart; the later write wins everywhere, the other is logged.
let fromLaptop = try laptop.write { $0.setSetting(SettingKey.weekStart, to: 7, scope: .synced) }
let fromPhone = try phone.write { $0.setSetting(SettingKey.weekStart, to: 6, scope: .synced) }
try ship(fromLaptop, to: phone)
try ship(fromPhone, to: laptop)

for store in [laptop, phone] {
    let state = store.state
    print("\(state.name):")
    print("  synced:", state.settings(scope: .synced).sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " "))
    print("  local: ", state.settings(scope: .local).sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " "))
}
guard laptop.state.settings(scope: .synced) == phone.state.settings(scope: .synced),
      laptop.state.setting("windowWidth", scope: .local) == 1280, phone.state.setting("windowWidth", scope: .local) == nil,
      laptop.state.setting(SettingKey.powerMode, scope: .local) == nil
else {
    print("settings scopes did not behave as documented")
    exit(1)
}
print("conflicts logged on the laptop:", laptop.state.conflicts.entries.map { "\($0.field): kept \($0.winner.value), lost \($0.loser.value)" })
