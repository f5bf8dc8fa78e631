import Dispatch
import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
@testable import PeerSyncStore
import PeerSyncTestSupport
import Testing
import ShiftSchedulerModel

/// WAL checkpoints run off the commit path (`WALCheckpointer`), and the WAL still stays bounded.
@Suite("WAL checkpoints", .ownThread)
struct WALCheckpointTests {
    /// ~64 KiB per record: each commit adds ~35 WAL pages (the record row and its journal delta).
    private static let bulk = String(repeating: "x", count: 64 * 1024)

    @discardableResult
    private static func writeUntil(_ store: ReplicaStore, atMost commits: Int, _ done: () -> Bool) throws -> Int {
        var written = 0
        while !done() && written < commits {
            try store.write { try $0.save(Location(name: "bulk \(written)", address: bulk)) }
            written += 1
        }
        return written
    }

    private static func store(in directory: String, background: Bool) throws -> ReplicaStore {
        let store = try ReplicaStore.create(directory: directory, name: "a")
        if background { store.checkpointsInBackground = true }
        return store
    }

    /// The store reopens from disk with all `count` records.
    private static func expectReopens(_ directory: String, with count: Int) throws {
        let reopened = try ReplicaStore.open(directory: directory)
        #expect(try reopened.state.fetchAll(Location.self).count == count)
    }

    @Test("commits during a background pass are checkpointed by the next commit, and the WAL starts over")
    func tailAfterBackgroundPass() throws {
        let directory = try makeTemporaryDirectory("peersync-wal")
        defer { removeTemporaryDirectory(directory) }
        let store = try Self.store(in: directory, background: true)
        let checkpointer = store.checkpointer
        let passDone = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        checkpointer.afterBackgroundPass.withLock { $0 = { passDone.signal(); _ = release.wait(timeout: .now() + 30) } }

        // Commit until one takes the WAL past the background threshold; that commit started a pass.
        var written = try Self.writeUntil(store, atMost: 1_000) { checkpointer.counts.largestWAL >= WALCheckpointer.backgroundPages }
        #expect(checkpointer.counts.largestWAL >= WALCheckpointer.backgroundPages, "the WAL never reached the threshold")
        #expect(passDone.wait(timeout: .now() + 30) == .success, "no background checkpoint ran")
        checkpointer.afterBackgroundPass.withLock { $0 = nil }
        // The pass has copied what it saw; these commits land after it, so the WAL cannot start over
        // until they are copied too.
        written += try Self.writeUntil(store, atMost: 10) { false }
        #expect(checkpointer.counts.background == 0 && checkpointer.counts.inline == 0)
        release.signal()
        checkpointer.waitForBackgroundPass()
        #expect(checkpointer.counts.background == 1)

        // The next commit copies the tail inline; the one after it finds every frame copied and
        // rewinds the WAL, so the WAL then holds that commit alone.
        written += try Self.writeUntil(store, atMost: 1) { false }
        #expect(checkpointer.counts.tails == 1)
        written += try Self.writeUntil(store, atMost: 1) { false }
        #expect(checkpointer.counts.lastWAL < 100, "the WAL did not start over: \(checkpointer.counts.lastWAL) pages")

        try Self.expectReopens(directory, with: written)
    }

    @Test("a background pass that does not finish leaves the WAL bounded: commits checkpoint inline")
    func inlineWhenBackgroundFallsBehind() throws {
        let directory = try makeTemporaryDirectory("peersync-wal")
        defer { removeTemporaryDirectory(directory) }
        let store = try Self.store(in: directory, background: true)
        let checkpointer = store.checkpointer
        let release = DispatchSemaphore(value: 0)
        checkpointer.afterBackgroundPass.withLock { $0 = { _ = release.wait(timeout: .now() + 60) } }
        defer { release.signal() }

        let written = try Self.writeUntil(store, atMost: 2_000) { checkpointer.counts.inline > 0 }
        #expect(checkpointer.counts.inline == 1, "the WAL grew past \(WALCheckpointer.inlinePages) pages unchecked")
        #expect(checkpointer.counts.background == 0)
        // One commit adds well under 100 pages: the WAL never went far past the inline bound.
        #expect(checkpointer.counts.largestWAL < WALCheckpointer.inlinePages + 100)
        release.signal()
        checkpointer.waitForBackgroundPass()

        try Self.expectReopens(directory, with: written)
    }

    @Test("by default (a process that may exit after one commit) a commit past the threshold checkpoints inline")
    func inlineByDefault() throws {
        let directory = try makeTemporaryDirectory("peersync-wal")
        defer { removeTemporaryDirectory(directory) }
        let store = try Self.store(in: directory, background: false)
        let checkpointer = store.checkpointer
        #expect(!store.checkpointsInBackground)
        let written = try Self.writeUntil(store, atMost: 1_000) { checkpointer.counts.inline > 0 }
        #expect(checkpointer.counts.inline == 1 && checkpointer.counts.background == 0)
        #expect(checkpointer.counts.largestWAL < WALCheckpointer.backgroundPages + 100)
        // Every frame was copied inline: the next write starts the WAL over.
        try Self.writeUntil(store, atMost: 1) { false }
        #expect(checkpointer.counts.lastWAL < 100)
        try Self.expectReopens(directory, with: written + 1)
    }
}
