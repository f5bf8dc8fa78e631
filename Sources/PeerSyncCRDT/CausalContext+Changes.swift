extension CausalContext {
    /// The entries of this context whose replica's part (vector entry and cloud dots) differs
    /// from `earlier`'s, each whole: joining the result into `earlier` gives `self` when
    /// `earlier` ⊆ `self` (an incremental ack carries this).
    ///
    /// - Complexity: O(replicas + cloud dots of the replicas compared).
    public func entriesChanged(since earlier: CausalContext) -> CausalContext {
        var changed = CausalContext()
        for (replica, counter) in versionVector
        where earlier.versionVector[replica] != counter || earlier.dotCloud[replica] != dotCloud[replica] {
            changed.setDecodedEntry(replica, contiguous: counter, ascendingCloud: dotCloud[replica].map { $0.sorted() } ?? [])
        }
        for (replica, cloud) in dotCloud where versionVector[replica] == nil {
            if earlier.versionVector[replica] == nil, earlier.dotCloud[replica] == cloud { continue }
            changed.setDecodedEntry(replica, contiguous: 0, ascendingCloud: cloud.sorted())
        }
        return changed
    }
}
