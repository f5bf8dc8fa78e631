extension RecordMap {
    /// The events of one replica beyond `counter`, up to its contiguous counter here, as a
    /// delta whose context is exactly those dots (`counter`+1 … last): what a device seals for a
    /// relay (docs/PROTOCOL.md §20.1, kind 1). Joined into any state it adds those events and
    /// claims no others, so it is safe to apply before or after the replica's earlier events.
    /// `through` stops the run early (a long history sealed in parts). Nil if this state holds
    /// no contiguous event of `replica` beyond `counter`.
    ///
    /// - Complexity: that of ``delta(missingFrom:)`` for a peer lacking only those events, plus
    ///   O(cloud dots of every replica).
    public func events(of replica: ReplicaID, after counter: UInt64, through: UInt64 = .max) -> (delta: RecordMap, last: UInt64)? {
        let last = min(through, context.contiguousCounter(of: replica))
        guard last > counter else { return nil }
        // A peer holding everything here except `replica`'s counter+1…last.
        var vector = context.versionVector
        vector[replica] = counter
        var peer = CausalContext(versionVector: vector)
        for (cloudReplica, counters) in context.dotCloud {
            for cloudCounter in counters { peer.insert(Dot(replica: cloudReplica, counter: cloudCounter)) }
        }
        let held = context.contiguousCounter(of: replica)
        if last < held {
            for later in (last + 1)...held { peer.insert(Dot(replica: replica, counter: later)) }
        }
        var delta = peer.isEmpty ? deltaByFullWalk(missingFrom: peer) : self.delta(missingFrom: peer)
        if counter == 0 {
            delta.setContext(CausalContext(versionVector: [replica: last]))
        } else {
            delta.setContext(CausalContext(dots: (counter + 1...last).lazy.map { Dot(replica: replica, counter: $0) }))
        }
        return (delta, last)
    }
}
