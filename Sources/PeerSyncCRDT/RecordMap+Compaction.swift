/// Compaction: removing deleted records once their deletion is causally stable.
///
/// A record is *purgeable* under a stable context `stable` (see ``CompactionFrontier``) when it
/// is invisible and every dot it holds — each field register's dot, each presence entry's add
/// dot and removal dot — is in `stable`. Purging removes the record whole and keeps the causal
/// context, so every later delta that still carries the record's old dots is recognised as
/// already seen and dropped (``apply(_:)`` on a replica state). docs/PROTOCOL.md §19.2–19.3
/// give the rule and the reasoning.
extension RecordMap {
    /// What one purge removed.
    package struct PurgeResult: Sendable, Equatable {
        /// The records removed, in no particular order.
        public var keys: [RecordKey] = []
        /// Field registers removed with them.
        public var fieldCount = 0
        /// Presence entries removed with them.
        public var presenceCount = 0

        public init() {}

        public var isEmpty: Bool { keys.isEmpty }

        /// Adds what another purge removed.
        public mutating func absorb(_ other: PurgeResult) {
            keys += other.keys
            fieldCount += other.fieldCount
            presenceCount += other.presenceCount
        }
    }

    /// Whether `state` may be purged under `stable`: invisible, and every dot it holds is in
    /// `stable`.
    ///
    /// - Complexity: O(fields + presence entries of the record).
    public static func isPurgeable(_ state: RecordState, stable: CausalContext) -> Bool {
        if state.isVisible { return false }
        for register in state.fields.values where !stable.contains(register.dot) { return false }
        for (writer, entry) in state.presence {
            if !stable.contains(Dot(replica: writer, counter: entry.counter)) { return false }
            if let removal = entry.removedBy, !stable.contains(removal) { return false }
        }
        return true
    }

    /// The keys of records purgeable under `stable`, at most `limit` of them.
    ///
    /// - Complexity: O(records held) (stops early at `limit`).
    public func purgeableKeys(stable: CausalContext, limit: Int = .max) -> [RecordKey] {
        var result: [RecordKey] = []
        guard limit > 0, !stable.isEmpty else { return result }
        for (collection, records) in collections {
            for (id, state) in records where Self.isPurgeable(state, stable: stable) {
                result.append(RecordKey(collection: collection, id: id))
                if result.count >= limit { return result }
            }
        }
        return result
    }

    /// Removes every purgeable record under `stable` (at most `limit`), keeping the context.
    ///
    /// - Complexity: O(records held) to find them, plus O(elements removed) for the digest.
    @discardableResult
    public mutating func purge(stable: CausalContext, limit: Int = .max) -> PurgeResult {
        purge(purgeableKeys(stable: stable, limit: limit), stable: stable)
    }

    /// Removes those of `keys` that are purgeable under `stable` (others, and keys not held,
    /// are left alone), keeping the context. A store passes the keys of its invisible records,
    /// a bounded batch at a time.
    ///
    /// - Complexity: O(elements of the named records).
    @discardableResult
    public mutating func purge(_ keys: some Sequence<RecordKey>, stable: CausalContext) -> PurgeResult {
        var result = PurgeResult()
        if !compactedThrough.includes(stable) { compactedThrough.merge(stable) }
        for key in keys {
            guard let state = collections[key.collection]?[key.id], Self.isPurgeable(state, stable: stable) else { continue }
            collections[key.collection]?[key.id] = nil
            if collections[key.collection]?.isEmpty == true { collections[key.collection] = nil }
            // A purged record is invisible, so it was never in the digest.
            result.keys.append(key)
            result.fieldCount += state.fields.count
            result.presenceCount += state.presence.count
        }
        // The dot index must not list records that are gone (extraction would look for them).
        if dotIndex != nil, !result.keys.isEmpty { dotIndex = DotIndex.build(collections) }
        return result
    }

    /// Whether `incoming` (part of a delta for `key`) is an echo of a record this state has
    /// purged: the record is not held here and every dot `incoming` holds is in the stable
    /// context this state was compacted with (``compactedThrough``). Such a record was
    /// invisible and purgeable here; a full state, a stale catch-up or a late delta from a
    /// replica that had not purged it yet would otherwise bring it back. A state that never
    /// compacted joins exactly as before (the check needs a non-empty ``compactedThrough``), so
    /// the join laws hold unchanged for deltas and uncompacted states; for compacted states the
    /// join is "join, then purge" — equal once both sides compacted with the same context.
    ///
    /// - Complexity: O(1) when the record is held; else O(elements of `incoming`).
    func isPurgedEcho(_ key: RecordKey, _ incoming: RecordState) -> Bool {
        if collections[key.collection]?[key.id] != nil { return false }
        let stable = compactedThrough
        for register in incoming.fields.values where !stable.contains(register.dot) { return false }
        for (writer, entry) in incoming.presence {
            if !stable.contains(Dot(replica: writer, counter: entry.counter)) { return false }
            if let removal = entry.removedBy, !stable.contains(removal) { return false }
        }
        return !incoming.isEmpty && !collides(key, incoming)
    }

    /// Whether a dot of `incoming` (a record not held) is held here by a *different* record. One
    /// event writes or removes one record, so this happens only when a dot was issued twice: a
    /// store restored from an older copy wrote again counters its former self had used (before
    /// a peer noticed and it continued as a new replica, ARCHITECTURE "Incarnations"). Both
    /// sides then hold the dot in their context, and a stable context may cover it, although
    /// each lacks the other's record; that record is new here, not an echo of a purge.
    ///
    /// - Complexity: O(dots of `incoming` × records listed under each) through the dot index;
    ///   O(records held) per call without one.
    func collides(_ key: RecordKey, _ incoming: RecordState) -> Bool {
        var found = false
        incoming.forEachDot { dot in
            guard !found else { return }
            func check(_ collection: String, _ id: UUID) {
                guard !found, collection != key.collection || id != key.id,
                      let held = collections[collection]?[id] else { return }
                held.forEachDot { if $0 == dot { found = true } }
            }
            if let dotIndex, dotIndex.forEachRecord(listing: dot, check) { return }
            for (collection, records) in collections {
                for id in records.keys { check(collection, id) }
            }
        }
        return found
    }

    /// Number of invisible records held (deleted records not purged yet).
    ///
    /// - Complexity: O(records held).
    public var invisibleRecordCount: Int {
        collections.values.reduce(0) { $0 + $1.values.reduce(0) { $0 + ($1.isVisible ? 0 : 1) } }
    }

    /// For each replica, the highest counter among the dots of invisible records that `stable`
    /// does not cover yet, as a version vector: what a member must have seen before those
    /// records can all be purged (for telling which device holds compaction back). Nil entries
    /// mean nothing of that replica is waiting.
    ///
    /// - Complexity: O(elements of invisible records).
    public func unstableDeletedFrontier(stable: CausalContext) -> CausalContext {
        var highest: [ReplicaID: UInt64] = [:]
        func note(_ dot: Dot) {
            if !stable.contains(dot), dot.counter > highest[dot.replica] ?? 0 { highest[dot.replica] = dot.counter }
        }
        for records in collections.values {
            for state in records.values where !state.isVisible {
                for register in state.fields.values { note(register.dot) }
                for (writer, entry) in state.presence {
                    note(Dot(replica: writer, counter: entry.counter))
                    if let removal = entry.removedBy { note(removal) }
                }
            }
        }
        return CausalContext(versionVector: highest)
    }
}
