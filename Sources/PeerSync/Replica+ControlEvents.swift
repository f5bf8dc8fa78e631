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

extension Replica {
    /// Acts on the replicator's control events: peers and status, removal, restores, joins,
    /// roster changes (data changes reach the app through the store's commit feed).
    func follow(_ events: AsyncStream<NodeEvent>) async {
        for await event in events {
            switch event {
            case .listening:
                if peerNames.isEmpty { setStatus(.connecting) }
            case .peerConnected(let info):
                peerNames[info.replicaID] = info.name
                setStatus(.syncing(progress: nil))
            case .peerDisconnected(let info, let reason):
                peerNames[info.replicaID] = nil
                if case .peerClosed(.deviceRemoved, let detail) = reason {
                    // A member's roster says this device was removed: nobody will sync with it.
                    noteRemoval(RemovalNotice(peer: info.address, detail: detail))
                } else if peerNames.isEmpty, case .peerClosed(let code, _) = reason,
                          ![.normal, .shuttingDown, .duplicateConnection].contains(code) {
                    // The peer refused us (an invite it would not take, clock skew, …): say why.
                    setStatus(.error(.session(address: info.address, reason: reason)))
                } else if peerNames.isEmpty {
                    setStatus(.connecting)
                }
            case .sessionRefused(let address, .peerClosed(.deviceRemoved, let detail)):
                noteRemoval(RemovalNotice(peer: address, detail: detail))
            case .sessionRefused(let address, let reason):
                if peerNames.isEmpty { setStatus(.error(.session(address: address, reason: reason))) }
                if case .refused(.overloaded, _) = reason {
                    refusedSessions += 1
                    await publishHealth()
                }
            case .connectionsRefused:
                await publishHealth()
            case .catchUpProgress(_, let chunk, let chunks, _):
                setStatus(.syncing(progress: Double(chunk) / Double(max(chunks, 1))))
            case .converged(let info, _) where divergences[info.replicaID] != nil:
                divergences[info.replicaID] = nil
                await publishHealth()
                setStatus(.inSync(lastSync: Date(), peers: peerNames.values.sorted()))
            case .converged:
                if case .peer? = removalNoted?.source { removalNoted = nil }  // a member synced with it: a peer's word was wrong
                setStatus(.inSync(lastSync: Date(), peers: peerNames.values.sorted()))
            case .divergenceRepaired(_, let count):
                repairs = count
                await publishHealth()
            case .divergenceDetail:
                break
            case .divergencePersists(let info, let collections, let writers, let records):
                divergences[info.replicaID] = SyncHealth.Divergence(
                    peer: info.replicaID.shortDescription, peerName: info.name, collections: collections,
                    writers: writers.map(\.shortDescription), records: records.map(\.description))
                await publishHealth()
            case .restoredStoreDetected(let info, let replica, let known, let held, let lostSince):
                guard replica == store.replicaID, let configuration else { break }
                let reason = "peer \(info.name) knows \(known) writes by this replica, the store has \(held): it was restored from an older copy"
                do {
                    let recovery = try Self.recoverFromRestore(store, key: deviceKey, groupID: groupID, lostReplica: replica,
                                                               lostSince: lostSince, reason: reason)
                    logger.warning("this store was restored from an older copy; continuing as a new replica", metadata: [
                        "replica.id": "\(store.replicaID.shortDescription)", "replica.previous": "\(replica.shortDescription)",
                        "restore.moved": "\(recovery.moved)",
                    ])
                } catch {
                    logger.error("cannot continue as a new replica", metadata: ["error": "\(error)"])
                    setStatus(.error(.storage("\(error)")))
                    break
                }
                // Sessions announce the replica ID: start them again under the new one.
                Task { try? await self.startSync(configuration) }
            case .restoreRecovered(let previous, let newIncarnation, let moved):
                logger.warning("a report this store did not sign shows it was restored from an older copy; recovered", metadata: [
                    "replica.id": "\(store.replicaID.shortDescription)", "replica.previous": "\(previous.shortDescription)",
                    "restore.moved": "\(moved)",
                ])
                guard newIncarnation, let configuration else { break }
                // Sessions announced the old replica ID: start them again under the new one.
                Task { try? await self.startSync(configuration) }
            case .joined:
                pendingJoin = nil
                do {
                    try store.setMembership(GroupMembership(groupID: groupID.bytes))
                } catch {
                    logger.error("cannot record the completed join", metadata: ["error": "\(error)"])
                }
            case .rosterChanged(let roster, let removedSelf):
                if removedSelf { noteRemoval(in: roster) }
                purgeRefusedWrites(roster)
            case .gossipReceived:
                scheduleCompaction()
            case .remoteChange:
                // The change itself reaches the app through the store's commit feed.
                scheduleCompaction()
                if case .inSync = status { setStatus(.syncing(progress: nil)) }
            }
        }
    }
}
