@_spi(Engine) import PeerSyncCRDT
import PeerSyncStore
import PeerSyncWire

/// The compaction gossip's own part, for the benchmarks that weigh it (issue 32): the frame of a
/// `seen` message carrying only `store`'s own newest signed report, as a full mesh sends it to
/// each peer in a gossip round where that report changed (0 if it has signed none yet).
func ownSeenFrameBytes(_ store: ReplicaStore) -> Int {
    let own = store.seenReports().filter { $0.replica == store.replicaID }
    return own.isEmpty ? 0 : SeenMessage.encodedFrame(own).count
}

/// Bytes of `store`'s own newest signed report (as it travels in a `seen` body, without its
/// length prefix), and of its context blob within it.
func ownSeenReportBytes(_ store: ReplicaStore) -> (report: Int, context: Int) {
    guard let own = store.seenReports().first(where: { $0.replica == store.replicaID }) else { return (0, 0) }
    return (own.bytes.count, own.context.encodedBlob().count)
}
