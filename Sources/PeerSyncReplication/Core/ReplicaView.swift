@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel

/// What the replication core reads of the local replica: its synced records, and through them
/// their causal context, their digest and what a peer lacks. Nothing else of the replica (its
/// clock, settings, conflict log, identity): the roster the core judges peers by is its own
/// (``ReplicationCore/roster``, refreshed by the shell), and the local replica ID is a setting.
///
/// ``ReplicaState`` provides it; the core's functions take `some ReplicaView`, so a call with a
/// replica state is specialized (no existential box, no copy of the records).
protocol ReplicaView {
    var records: RecordMap { get }
}

extension ReplicaView {
    var context: CausalContext { records.context }
    var digest: StateDigest { records.digest }

    /// What a peer with context `peer` lacks (the full state for an empty context).
    func delta(missingFrom peer: CausalContext) -> RecordMap { records.delta(missingFrom: peer) }
}

extension ReplicaState: ReplicaView {}
