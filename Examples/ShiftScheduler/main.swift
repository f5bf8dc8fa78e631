import Foundation
import Logging
import PeerSync
import ShiftSchedulerModel

// Two devices of a shift-planning team share shift types and locations over the LAN (here:
// two replicas on 127.0.0.1 with real TLS and real SQLite files). Deleting a location on one
// device leaves the shift types that used it with no location on both — no cascade, no conflict.

func waitFor(_ what: String, timeout: Duration = .seconds(20), _ condition: () throws -> Bool) async throws {
    let deadline = ContinuousClock.now + timeout
    while try !condition() {
        guard ContinuousClock.now < deadline else { throw ExampleError("timed out waiting for \(what)") }
        try await Task.sleep(for: .milliseconds(20))
    }
}

struct ExampleError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

let root = FileManager.default.temporaryDirectory.appendingPathComponent("shift-scheduler-\(UUID().uuidString)").path
defer { try? FileManager.default.removeItem(atPath: root) }

var logger = Logger(label: "example")
logger.logLevel = .warning
// The office starts a group (it is its first admin) and invites the ward's tablet: one code,
// good for one device, for a day.
let office = try Replica.create(at: root + "/office", name: "office", logger: logger)
let code = try await office.invite(role: .member, expires: .seconds(24 * 3600))
let tablet = try Replica.join(at: root + "/tablet", name: "ward tablet", invite: code, logger: logger)
let loopback = PeerAddress(host: "127.0.0.1", port: 0)
let officePort = try await office.startSync(SyncConfiguration(security: .tls, listen: loopback))
try await tablet.startSync(SyncConfiguration(security: .tls, listen: loopback, peers: [PeerAddress(host: "127.0.0.1", port: officePort)]))
try await waitFor("the tablet to join") { office.roster().isActive(tablet.deviceID) }
print("devices:", office.roster().activeDevices.map { "\($0.name) (\($0.role))" }.sorted())

// The office sets up locations and shift types.
let ward3 = Location(name: "Ward 3", address: "Main St 1")
let icu = Location(name: "ICU", address: "Main St 1, 2nd floor")
try await office.save(ward3)
try await office.save(icu)
let early = ShiftType(symbol: "E", title: "Early", description: "06:00–14:00", duration: 8 * 3600, locationID: ward3.id)
let night = ShiftType(symbol: "N", title: "Night", description: "22:00–06:00", duration: 8 * 3600, locationID: icu.id)
try await office.save(early)
try await office.save(night)

try await waitFor("the tablet to receive the shift types") { try tablet.fetchAll(ShiftType.self).count == 2 }
print("tablet sees:", try tablet.fetchAll(ShiftType.self).map { "\($0.symbol) \($0.title)" }.sorted())

// The ward closes ICU on the tablet.
try await tablet.delete(Location.self, id: icu.id)
try await waitFor("the office to see the deletion") { try office.fetch(Location.self, id: icu.id) == nil }
let nightOnOffice = try office.fetch(ShiftType.self, id: night.id)
print("after deleting ICU on the tablet, Night on the office has location:", nightOnOffice?.locationID.map(\.uuidString) ?? "none")
guard nightOnOffice?.locationID == nil, try office.fetch(ShiftType.self, id: early.id)?.locationID == ward3.id else {
    throw ExampleError("the dangling reference did not read as nil")
}
try await waitFor("both replicas to converge") { office.state.digest == tablet.state.digest }
print("converged: digest \(office.state.digest)")
await office.stopSync()
await tablet.stopSync()
