// Two replicas that sync through a transport the app brings — here an in-memory pipe, in an
// app MultipeerConnectivity, Network.framework or a WebSocket — with the transport-independent
// session API: the app moves bytes, PeerSync decides what they are.
import Foundation
import Logging
import PeerSync
import ShiftSchedulerModel

func waitFor(_ what: String, _ condition: () throws -> Bool) async throws {
    let deadline = ContinuousClock.now + .seconds(20)
    while try !condition() {
        guard ContinuousClock.now < deadline else { throw ExampleFailure("timed out waiting for \(what)") }
        try await Task.sleep(for: .milliseconds(10))
    }
}

struct ExampleFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

let root = FileManager.default.temporaryDirectory.appendingPathComponent("in-memory-pipe-\(UUID().uuidString)").path
defer { try? FileManager.default.removeItem(atPath: root) }

var logger = Logger(label: "example")
logger.logLevel = .warning
// The phone's group; the watch joins it with an invite, over the pipe itself.
let phone = try Replica.create(at: root + "/phone", name: "phone", logger: logger)
let watch = try Replica.join(at: root + "/watch", name: "watch", invite: try await phone.invite(), logger: logger)
try await phone.save(Location(name: "Ward 3", address: "Main St 1"))
try await watch.save(ShiftType(symbol: "N", title: "Night", duration: 10 * 3600))

// One session per side of the "connection". `initiator` says which side opened it.
let phoneSide = try await phone.openSession(address: "pipe:watch", initiator: true)
let watchSide = try await watch.openSession(address: "pipe:phone", initiator: false)

// The app's transport: deliver each side's messages to the other, in order.
var bytesOnThePipe = 0
let (counted, counter) = AsyncStream<Int>.makeStream()
let pumps = [
    Task { while let message = await phoneSide.nextMessage() { counter.yield(message.count); await watchSide.receive(message) } },
    Task { while let message = await watchSide.nextMessage() { counter.yield(message.count); await phoneSide.receive(message) } },
]

try await waitFor("the first catch-up") { phone.state.digest == watch.state.digest }
print("after catch-up, the watch has:", try watch.fetchAll(Location.self).map(\.name), try watch.fetchAll(ShiftType.self).map(\.title))

try await phone.save(Location(name: "ICU"))
try await waitFor("a live change") { try watch.fetchAll(Location.self).count == 2 }
print("a live change crossed the pipe:", try watch.fetchAll(Location.self).map(\.name).sorted())

await phoneSide.close()  // a goodbye, then both sessions end
for pump in pumps { await pump.value }
counter.finish()
for await n in counted { bytesOnThePipe += n }
print("digests equal:", phone.state.digest == watch.state.digest, "— \(bytesOnThePipe) bytes crossed the pipe")
await phone.stopSync()
await watch.stopSync()
guard phone.state.digest == watch.state.digest else { throw ExampleFailure("the replicas differ") }
