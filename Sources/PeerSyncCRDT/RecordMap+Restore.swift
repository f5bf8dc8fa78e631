/// What a replica that comes back from the past does to its state (docs/ARCHITECTURE.md,
/// "Restores"): the writes it made since it went back in time move to its new incarnation, and
/// what it holds that the group purged meanwhile is deleted.
extension RecordMap {
    /// This state with the events `counters` of replica `old` re-issued as events of `new`,
    /// counter for counter in ascending order from `firstCounter`: every field written, presence
    /// entry added and removal made by one of those events now carries the new dot, and the
    /// context holds the new dots instead of the old ones. Timestamps and values are kept, so
    /// last-writer-wins decides exactly as before.
    ///
    /// A store restored in place (its file overwritten by an older copy) writes on under its old
    /// replica ID until a peer notices, issuing again counters its lost future had used; peers
    /// take those dots as seen and never receive the writes. Moved to a fresh ID they are news
    /// to everyone, and the old counters — now absent from this context — bring back what the
    /// lost future wrote under them. Returns the new state and the records it changed; nil if
    /// `counters` holds none of this state's dots of `old`, or if removing them would leave the
    /// context past its limits.
    ///
    /// - Complexity: O(size of the state).
    public func movingEvents(_ counters: Set<UInt64>, of old: ReplicaID, to new: ReplicaID,
                             firstCounter: UInt64) -> (state: RecordMap, changed: Set<RecordKey>)? {
        let moving = counters.filter { context.contains(Dot(replica: old, counter: $0)) }
        guard !moving.isEmpty, old != new else { return nil }
        var map: [UInt64: UInt64] = [:]
        for (offset, counter) in moving.sorted().enumerated() { map[counter] = firstCounter + UInt64(offset) }
        func moved(_ dot: Dot) -> Dot? {
            guard dot.replica == old, let counter = map[dot.counter] else { return nil }
            return Dot(replica: new, counter: counter)
        }
        var records: [(RecordKey, RecordState)] = []
        var changed: Set<RecordKey> = []
        for (collection, held) in collections {
            for (id, state) in held {
                var next = state
                var touched = false
                for (name, register) in state.fields {
                    guard let dot = moved(register.dot) else { continue }
                    next.fields[name] = FieldRegister(value: register.value, timestamp: register.timestamp, dot: dot,
                                                      supersedes: register.supersedes)
                    touched = true
                }
                for (writer, entry) in state.presence {
                    let removal = entry.removedBy.flatMap(moved)
                    if let add = moved(Dot(replica: writer, counter: entry.counter)) {
                        // The write moves: its entry becomes the new replica's. (An older entry of
                        // `old` for this record, if any, was replaced by it; peers still hold it.)
                        next.presence[writer] = nil
                        let removedBy = removal ?? entry.removedBy
                        next.presence[new] = PresenceEntry(counter: add.counter, removedBy: removedBy)
                        touched = true
                    } else if let removal {
                        next.presence[writer] = PresenceEntry(counter: entry.counter, removedBy: removal)
                        touched = true
                    }
                }
                let key = RecordKey(collection: collection, id: id)
                if touched { changed.insert(key) }
                records.append((key, next))
            }
        }
        var moves = context.removing(Set(map.keys), of: old)
        guard moves.limitViolation == nil else { return nil }
        for counter in map.values { moves.insert(Dot(replica: new, counter: counter)) }
        return (RecordMap(records: records, context: moves), changed)
    }

    /// The records not in `keys` whose every dot is in `stable`, outside the reserved collections
    /// (names starting with `_`, such as the roster, which is never purged).
    ///
    /// A peer whose state is *complete* (it sent every record it holds) and that compacted with
    /// `stable` holds every record whose events it has seen, except the deleted ones it purged.
    /// A record held here, absent from what it sent, with all its events in `stable`, is one of
    /// those: the group deleted and purged it while this replica was in the past (restored from
    /// an older backup), so it goes here too (``dropPurgedElsewhere(_:stable:)``).
    ///
    /// - Complexity: O(records held).
    public func recordsPurgedElsewhere(completeKeys keys: Set<RecordKey>, stable: CausalContext) -> [RecordKey] {
        guard !stable.isEmpty else { return [] }
        var result: [RecordKey] = []
        for (collection, held) in collections where !collection.hasPrefix("_") {
            for (id, state) in held {
                let key = RecordKey(collection: collection, id: id)
                guard !keys.contains(key) else { continue }
                var inside = true
                state.forEachDot { if inside, !stable.contains($0) { inside = false } }
                if inside { result.append(key) }
            }
        }
        return result.sorted()
    }

    /// Removes `keys` — records a complete round showed the group purged while this replica was
    /// in the past, visible here or not — and joins `stable` into ``compactedThrough``, as if this
    /// state had compacted with it: echoes of those records, from a replica that still holds one
    /// (another device back from the past), are dropped from now on (``isPurgedEcho(_:_:)``). A
    /// key whose record holds a dot outside `stable` is left alone. Not a delete: a delete would
    /// bring the purged record back as a deleted one to every replica that had forgotten it,
    /// where a later full state could revive it.
    ///
    /// - Complexity: O(elements of the named records), plus a dot-index rebuild.
    @discardableResult
    public mutating func dropPurgedElsewhere(_ keys: some Sequence<RecordKey>, stable: CausalContext) -> PurgeResult {
        var result = PurgeResult()
        if !compactedThrough.includes(stable) { compactedThrough.merge(stable) }
        for key in keys {
            guard let state = collections[key.collection]?[key.id] else { continue }
            var inside = true
            state.forEachDot { if inside, !stable.contains($0) { inside = false } }
            guard inside else { continue }
            collections[key.collection]?[key.id] = nil
            if collections[key.collection]?.isEmpty == true { collections[key.collection] = nil }
            if maintainedDigest != nil, state.isVisible {
                for (name, register) in state.fields { maintainedDigest!.remove(Self.hash(key, name, register)) }
                for (replica, entry) in state.presence { maintainedDigest!.remove(Self.hash(key, replica, entry)) }
            }
            result.keys.append(key)
            result.fieldCount += state.fields.count
            result.presenceCount += state.presence.count
        }
        if dotIndex != nil, !result.keys.isEmpty { dotIndex = DotIndex.build(collections) }
        return result
    }

    /// The physical milliseconds of the newest write this state holds by `replica` with a counter
    /// above `counter` (nil if none): how recent the writes are that a peer lacks in its own name.
    ///
    /// - Complexity: O(size of the state).
    public func newestWrite(by replica: ReplicaID, above counter: UInt64) -> UInt64? {
        var newest: UInt64?
        for held in collections.values {
            for state in held.values {
                for register in state.fields.values where register.dot.replica == replica && register.dot.counter > counter {
                    newest = max(newest ?? 0, register.timestamp.physicalMilliseconds)
                }
            }
        }
        return newest
    }
}

extension CausalContext {
    /// This context without the dots `counters` of `replica` (those above the remaining
    /// contiguous run become cloud dots).
    ///
    /// - Complexity: O(counters + the replica's cloud + the dots between the lowest removed and
    ///   the contiguous counter).
    public func removing(_ counters: Set<UInt64>, of replica: ReplicaID) -> CausalContext {
        guard !counters.isEmpty, replicas.contains(replica) else { return self }
        let contiguous = contiguousCounter(of: replica)
        var cloud = Set(dotCloud[replica] ?? [])
        cloud.subtract(counters)
        var top = contiguous
        if let lowest = counters.filter({ $0 <= contiguous }).min() {
            top = lowest - 1
            // Dots between the new top and the old contiguous counter stay seen, as cloud dots.
            if contiguous > lowest {
                for counter in (lowest + 1)...contiguous where !counters.contains(counter) { cloud.insert(counter) }
            }
        }
        var result = CausalContext()
        for other in replicas where other != replica {
            var otherCloud: [UInt64] = []
            var otherTop: UInt64 = 0
            forEachEntry(of: other) { counter, inCloud in
                if inCloud { otherCloud.append(counter) } else { otherTop = counter }
            }
            result.setDecodedEntry(other, contiguous: otherTop, ascendingCloud: otherCloud.sorted())
        }
        result.setDecodedEntry(replica, contiguous: top, ascendingCloud: cloud.sorted())
        return result
    }
}

/// A complete catch-up round a peer sent (PROTOCOL §6.5): every record it holds, because this
/// replica's context lacked part of the stable context the peer compacted with.
package struct CompleteRound: Sendable, Equatable {
    /// The stable context the peer compacted with.
    public var stable: CausalContext
    /// Every record the round carried.
    public var keys: Set<RecordKey>

    public init(stable: CausalContext, keys: Set<RecordKey>) {
        self.stable = stable
        self.keys = keys
    }
}
