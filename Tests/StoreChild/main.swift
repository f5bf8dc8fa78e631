import Foundation
import PeerSyncModel
import PeerSyncStore
import ShiftSchedulerModel

// A child process for the store tests (not shipped): it writes to a store while the test
// process watches, or gets killed with SIGKILL in the middle of its writes.
//
//   peersync-store-child write DIR COUNT   one Location per transaction; after each commit
//                                          prints "committed <uuid>" and flushes
//   peersync-store-child compact DIR       purges every deleted record (the store is its group's
//                                          only replica: its whole context is stable), 50 per
//                                          batch, printing "batch <n> purged <total>" after each
func say(_ line: String) { FileHandle.standardOutput.write(Data((line + "\n").utf8)) }  // unbuffered
let arguments = CommandLine.arguments
if arguments.count == 3, arguments[1] == "compact" {
    do {
        let store = try ReplicaStore.open(directory: arguments[2])
        let run = try store.compact(stable: store.state.context, batchSize: 50) { run in
            say("batch \(run.batches) purged \(run.purgedRecords)")
            return true
        }
        say("done \(run.purgedRecords)")
    } catch {
        FileHandle.standardError.write(Data("peersync-store-child: \(error)\n".utf8))
        exit(1)
    }
    exit(0)
}
guard arguments.count == 4, arguments[1] == "write", let count = Int(arguments[3]) else {
    FileHandle.standardError.write(Data("usage: peersync-store-child write DIR COUNT | compact DIR\n".utf8))
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
