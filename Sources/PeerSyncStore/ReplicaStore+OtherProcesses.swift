import Foundation
import GRDB
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import Synchronization

/// Other processes' commits to the same store file, joined from the journal.
extension ReplicaStore {
    /// Joins what other processes committed since this one last looked. Cheap when nothing
    /// changed (one `PRAGMA data_version`). Returns the changes, in commit order. A store
    /// without a file of its own watches no other process: only what its own transactions
    /// joined is returned.
    public func refresh() throws(StoreError) -> [StoreChange] {
        do {
            let version = try observer?.inDatabase { try Int.fetchOne($0, sql: "PRAGMA data_version") }
            let takeAbsorbed = { (inner: inout Inner) -> [StoreChange] in
                defer { inner.absorbed = [] }
                return inner.absorbed
            }
            // While this process is writing, its transaction joins other processes' commits
            // itself (they come out as `absorbed` on a later call): no need to wait for it.
            let outcome = try writer.withLockIfAvailable { _ in
                try inner.withLock { inner in
                    var changes = takeAbsorbed(&inner)
                    if version != inner.dataVersion {
                        inner.dataVersion = version
                        let joined = try pool.read { db in try self.catchUp(db, &inner.state, &inner.position) }
                        if !joined.isEmpty { commits.publish(state: inner.state, absorbed: joined, deltas: []) }
                        changes += joined
                    }
                    return changes
                }
            }
            return outcome ?? inner.withLock { takeAbsorbed(&$0) }
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }

    /// Polls ``refresh()`` every `interval` and yields each change other processes commit.
    /// The stream ends with an error if the store fails; cancel the consuming task to stop.
    /// A store without a file of its own watches no other process: its stream ends at once.
    public func externalChanges(every interval: Duration = .milliseconds(5)) -> AsyncThrowingStream<StoreChange, any Error> {
        AsyncThrowingStream { continuation in
            guard observer != nil else { return continuation.finish() }
            let task = Task {
                do {
                    while !Task.isCancelled {
                        for change in try self.refresh() { continuation.yield(change) }
                        try await Task.sleep(for: interval)
                    }
                    continuation.finish()
                } catch is CancellationError {
                    continuation.finish()
                } catch {
                    continuation.finish(throwing: error)
                }
            }
            continuation.onTermination = { _ in task.cancel() }
        }
    }
}
