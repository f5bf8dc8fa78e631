/// The digest split by collection and by writer, to say *where* two states differ when their
/// digests do (the convergence watchdog). Computed from scratch — it is needed only when
/// something is wrong.
package struct DigestBreakdown: Sendable, Equatable {
    /// Fields and presence entries of each collection.
    public var collections: [String: StateDigest] = [:]
    /// Fields written by, presence entries of, and context entries of each replica.
    public var writers: [ReplicaID: StateDigest] = [:]

    public init(collections: [String: StateDigest] = [:], writers: [ReplicaID: StateDigest] = [:]) {
        self.collections = collections
        self.writers = writers
    }

    /// Collections and writers whose parts differ between `self` and `other` (sorted).
    public func differences(from other: DigestBreakdown) -> (collections: [String], writers: [ReplicaID]) {
        let collections = Set(self.collections.keys).union(other.collections.keys)
            .filter { self.collections[$0] != other.collections[$0] }.sorted()
        let writers = Set(self.writers.keys).union(other.writers.keys)
            .filter { self.writers[$0] != other.writers[$0] }.sorted()
        return (collections, writers)
    }
}

extension RecordMap {
    /// The digest's elements summed per collection and per writer.
    ///
    /// - Complexity: O(size of the state).
    public func digestBreakdown() -> DigestBreakdown {
        var breakdown = DigestBreakdown()
        for (collection, records) in collections {
            var sum = StateDigest()
            for (id, state) in records where state.isVisible {
                let key = RecordKey(collection: collection, id: id)
                for (name, register) in state.fields {
                    let h = Self.hash(key, name, register)
                    sum.add(h)
                    breakdown.writers[register.dot.replica, default: StateDigest()].add(h)
                }
                for (replica, entry) in state.presence {
                    let h = Self.hash(key, replica, entry)
                    sum.add(h)
                    breakdown.writers[replica, default: StateDigest()].add(h)
                }
            }
            breakdown.collections[collection] = sum
        }
        for replica in context.replicas {
            breakdown.writers[replica, default: StateDigest()].add(Self.contextHash(context, replica))
        }
        return breakdown
    }
}
