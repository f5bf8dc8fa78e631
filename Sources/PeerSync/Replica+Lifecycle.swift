import Foundation
import PeerSyncStore

extension Replica {
    /// Closes the replica: stops sync (goodbyes sent, what peers sent stored), stops its
    /// background work (watching other processes, attachment clean-up, compaction), and
    /// releases the store's files. Every write that returned before was on disk already, so
    /// nothing is lost; open the same directory again with ``open(at:name:logger:)`` to carry on.
    /// Afterwards reads return the state as it was, and writes throw ``ReplicaError/storage(_:)``
    /// ("… was closed"). Calling it again does nothing.
    public func close() async {
        guard !isClosed else { return }
        isClosed = true
        await stopSync()
        appSupport.stop()
        await compactionScheduler.stop()
        do {
            try store.close()
        } catch {
            logger.debug("closing the store failed", metadata: ["error": "\(error)"])
        }
    }
}
