import Foundation
import Logging
import PeerSync
import ShiftSchedulerModel

// A child process for the app-API tests (not shipped).
//
//   peersync-app-child batch DIR SIZE     forever: one batch per commit — SIZE new locations named
//                                         "batch <n> #<i>", the synced setting "lastBatch" = n, and the
//                                         deletion of batch n-1's marker; prints "committed <n>" after each
//   peersync-app-child write DIR COUNT MS  COUNT shift types titled "child <i>", one commit each, MS
//                                         milliseconds apart; prints "committed <uuid>" after each
//   peersync-app-child attach DIR         forever: adds 1 MiB attachments of random bytes; prints
//                                         "added <hex sha256>" after each
func say(_ line: String) { FileHandle.standardOutput.write(Data((line + "\n").utf8)) }  // unbuffered
func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("peersync-app-child: \(message)\n".utf8))
    exit(1)
}

let arguments = CommandLine.arguments
var logger = Logger(label: "child")
logger.logLevel = .critical
do {
    switch (arguments.count, arguments.dropFirst().first) {
    case (4, "batch"):
        guard let size = Int(arguments[3]), size > 0 else { fail("SIZE must be a positive number") }
        let replica = try Replica.open(at: arguments[2], name: "batch child", logger: logger)
        var previousMarker: UUID?
        var n = 0
        while true {
            n += 1
            let batch = n
            let marker = Location(name: "marker \(batch)", address: "marker")
            let previous = previousMarker
            try await replica.batch { b in
                for i in 0..<size { try b.save(Location(name: "batch \(batch) #\(i)", address: "\(batch)")) }
                try b.save(marker)
                if let previous { try b.delete(Location.self, id: previous) }
                try b.setSetting("lastBatch", to: .int(Int64(batch)), scope: .synced)
            }
            previousMarker = marker.id
            say("committed \(batch)")
        }
    case (5, "write"):
        guard let count = Int(arguments[3]), let interval = Int(arguments[4]) else { fail("COUNT and MS must be numbers") }
        let store = try ReplicaStore.open(directory: arguments[2])
        for i in 0..<count {
            let shiftType = ShiftType(symbol: "C", title: "child \(i)", duration: 3600)
            try store.write { try $0.save(shiftType) }
            say("committed \(shiftType.id.uuidString)")
            if interval > 0 { try await Task.sleep(for: .milliseconds(interval)) }
        }
        say("done")
    case (3, "attach"):
        let replica = try Replica.open(at: arguments[2], name: "attach child", logger: logger)
        var generator = SystemRandomNumberGenerator()
        while true {
            let bytes = Data((0..<(1 << 20)).map { _ in UInt8.random(in: 0...255, using: &generator) })
            let attachment = try await replica.addAttachment(bytes)
            say("added \(attachment.contentHash.hex)")
        }
    default:
        fail("usage: peersync-app-child batch DIR SIZE | write DIR COUNT MS | attach DIR")
    }
} catch {
    fail("\(error)")
}
