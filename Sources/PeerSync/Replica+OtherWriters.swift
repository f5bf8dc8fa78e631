import Foundation
import Logging
@_spi(Engine) import PeerSyncCRDT
import PeerSyncDiscovery
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncReplication
import PeerSyncNetwork
import PeerSyncStore
import PeerSyncWire
import Synchronization

/// Writes that reach the store other than through this replica's own API: other processes'
/// commits, and a removed device's writes that must go again once its removal is known.
extension Replica {
    /// Polls the store for other processes' commits (every 5 ms) until cancelled. What it
    /// joins goes out through the store's commit feed, like every commit: to peers (by the
    /// replicator) and to ``changes()``.
    public func watchOtherProcesses() async {
        do {
            for try await _ in store.externalChanges() {}
        } catch {
            logger.error("cannot read the store", metadata: ["error": "\(error)"])
            setStatus(.error(.storage("\(error)")))
        }
    }

    /// Drops what a removed device wrote past its cutoff and reached this replica before it
    /// learned of the removal (members that knew refused it on receipt), so every member ends
    /// with the same data. The dots stay in the context: those writes are never offered again.
    func purgeRefusedWrites(_ roster: Roster) {
        guard roster.devices.values.contains(where: { !$0.isActive }) || !roster.banned.isEmpty else { return }
        do {
            let purged = try store.replaceRecords(reason: "writes of removed devices") { state in
                guard let stripped = state.records.strippingRefused(by: roster) else { return [:] }
                let kept = Dictionary(uniqueKeysWithValues: stripped.delta.allRecords.map { ($0.0, $0.1) })
                var replacements: [RecordKey: RecordState?] = [:]
                for (key, record) in state.records.allRecords where kept[key] != record { replacements[key] = kept[key] }
                return replacements
            }
            if purged > 0 {
                logger.info("dropped writes a removed device made past its cutoff", metadata: ["records": "\(purged)"])
            }
        } catch {
            logger.error("cannot drop a removed device's writes", metadata: ["error": "\(error)"])
        }
    }
}
