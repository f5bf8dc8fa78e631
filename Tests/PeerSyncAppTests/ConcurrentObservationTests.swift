import Foundation
@testable import PeerSync
import PeerSyncTestSupport
import Synchronization
import Testing
import ShiftSchedulerModel

/// Live queries while local edits, a peer over TLS on 127.0.0.1 and another process all write
/// at once.
@Suite("Live queries under concurrent writers", .ownThread, .timeLimit(.minutes(6)))
struct ConcurrentObservationTests {
    @Test("local, peer and other-process changes: every element is a committed state, in commit order")
    func threeWriters() async throws {
        let observed = try TestApp("observed")
        let peer = try TestApp("peer")
        defer { Task { await observed.close(); await peer.close() } }
        try await connect(observed.replica, peer.replica)

        let query = RecordQuery(ShiftType.self, sortedBy: [KeyPathComparator(\ShiftType.title)])
        let live = Recorder(observed.replica.observe(query))
        #expect(await live.wait(count: 1))

        // Three writers at once: this process, the peer (received over the session) and a
        // child process committing into the observed store.
        let perWriter = 60
        let child = try ChildProcess(buildProductsDirectory().appendingPathComponent("peersync-app-child").path,
                                     ["write", observed.directory, "\(perWriter)", "2"])
        async let local: Void = {
            for i in 0..<perWriter { try await observed.replica.save(ShiftType(symbol: "L", title: "local \(i)", duration: 60)) }
        }()
        async let remote: Void = {
            for i in 0..<perWriter { try await peer.replica.save(ShiftType(symbol: "R", title: "remote \(i)", duration: 60)) }
        }()
        try await local
        try await remote
        #expect(child.wait(timeout: .seconds(60)) == 0)

        let everything = await live.wait(timeout: .seconds(30)) { $0.count == 3 * perWriter }
        #expect(everything, "got \(live.last?.count ?? 0) of \(3 * perWriter)")
        #expect(live.last == (try observed.replica.fetchAll(query)))

        // Each writer commits its records in order, and every state this replica passes
        // through holds a prefix of each writer's sequence; an element mixing states (a
        // later change visible while an earlier one is not) would break that.
        var previous: Set<String> = []
        for element in live.all {
            let present = Set(titles(element))
            for prefix in ["local", "remote", "child"] {
                let numbers = present.filter { $0.hasPrefix(prefix + " ") }.compactMap { Int($0.split(separator: " ")[1]) }.sorted()
                #expect(numbers == Array(0..<numbers.count), "\(prefix): \(numbers)")
            }
            // Only additions happen: states move forward, so nothing seen disappears.
            #expect(previous.isSubset(of: present))
            #expect(element == element.sorted(by: query.areInIncreasingOrder))
            previous = present
        }
        #expect(zip(live.all, live.all.dropFirst()).allSatisfy { $0 != $1 })
        #expect(live.error == nil)
    }

    @Test("an observer never sees part of a batch")
    func batchesAreSeenWhole() async throws {
        let app = try TestApp("batches")
        defer { Task { await app.close() } }
        let live = Recorder(app.replica.observe(Location.self))
        #expect(await live.wait(count: 1))
        // A second Replica on the same store (as a second process would) writes batches of 25.
        let writer = try TestApp(sharing: app, name: "writer")
        for n in 0..<20 {
            try await writer.replica.batch { b in
                for i in 0..<25 { try b.save(Location(name: "batch \(n) #\(i)")) }
            }
        }
        // And this one writes batches of 25 too, interleaved with the other's.
        for n in 0..<20 {
            try await app.replica.batch { b in
                for i in 0..<25 { try b.save(Location(name: "local batch \(n) #\(i)")) }
            }
        }
        #expect(await live.wait { $0.count == 1_000 })
        for element in live.all { #expect(element.count % 25 == 0, "an element held \(element.count) records") }
        #expect(live.error == nil)
    }

    @Test("while an observation lives, other processes' commits are watched even with sync off")
    func watchesOtherProcessesWhileObserved() async throws {
        let app = try TestApp("watched")
        defer { Task { await app.close() } }
        #expect(!app.replica.appSupport.isWatchingOtherProcesses)
        let shiftTypes = Recorder(app.replica.observe(ShiftType.self))
        let locations = Recorder(app.replica.observe(Location.self))
        #expect(await shiftTypes.wait(count: 1))
        #expect(await locations.wait(count: 1))
        #expect(app.replica.appSupport.isWatchingOtherProcesses)
        let child = try ChildProcess(buildProductsDirectory().appendingPathComponent("peersync-app-child").path,
                                     ["write", app.directory, "3", "0"])
        #expect(child.wait(timeout: .seconds(30)) == 0)
        #expect(await shiftTypes.wait { titles($0).sorted() == ["child 0", "child 1", "child 2"] })
        shiftTypes.stop()
        #expect(app.replica.appSupport.isWatchingOtherProcesses)  // the other observation still runs
        locations.stop()
        // Both iterators are gone: the watch stops.
        #expect(await eventually { !app.replica.appSupport.isWatchingOtherProcesses })
    }
}
