import Foundation
import PeerSyncModel
import PeerSyncStore

// A child process for the store tests (not shipped): it writes to a store while the test
// process watches, or gets killed with SIGKILL in the middle of its writes.
//
//   peersync-store-child write DIR COUNT   one Location per transaction; after each commit
//                                          prints "committed <uuid>" and flushes
func say(_ line: String) { FileHandle.standardOutput.write(Data((line + "\n").utf8)) }  // unbuffered
let arguments = CommandLine.arguments
guard arguments.count == 4, arguments[1] == "write", let count = Int(arguments[3]) else {
    FileHandle.standardError.write(Data("usage: peersync-store-child write DIR COUNT\n".utf8))
    exit(2)
}
do {
    let store = try ReplicaStore.open(directory: arguments[2])
    for i in 0..<count {
        let location = Location(name: "child \(i)", address: "pid \(getpid())")
        try store.write { state in try state.save(location) }
        say("committed \(location.id.uuidString)")
    }
    say("done")
} catch {
    FileHandle.standardError.write(Data("peersync-store-child: \(error)\n".utf8))
    exit(1)
}
