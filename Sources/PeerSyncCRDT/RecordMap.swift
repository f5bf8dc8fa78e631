/// All records of a replica, in named collections: an observed-remove map of records whose
/// fields are last-writer-wins registers, with one causal context for the whole replica.
///
/// - A write (one or more fields of one record) is one event: it takes the writer's next dot,
///   stamps every written field with it, and sets the writer's presence entry for the record.
/// - A delete is one event: it kills the presence entries it observed (see ``PresenceEntry``);
///   fields stay, so a concurrent write revives the record whole.
/// - ``apply(_:)`` joins a delta (or a whole state) and reports what changed, including
///   concurrent overwrites (``FieldConflict``).
/// - ``delta(missingFrom:)`` extracts exactly what a peer lacks, given the peer's context.
/// - ``digest`` is kept current on every change in O(changed elements).
///
/// Deltas are `RecordMap`s too, so they compose: joining two deltas gives a delta that has the
/// effect of both.
package struct RecordMap: Sendable {
    /// collection → record ID → state. Never holds empty collections or empty records.
    public internal(set) var collections: [String: [UUID: RecordState]]
    /// Every dot this state has seen.
    public internal(set) var context: CausalContext
    /// The incrementally maintained digest, or nil for deltas and extracts that are built to be
    /// shipped (their digest is computed only if someone asks). It leaves out the context's
    /// version vector entries, which ``digest`` adds when it is read (O(replicas)): every local
    /// write and every applied one-event delta moves one, and hashing the entry out and in
    /// again was a fifth of applying a one-field delta (W2 in memory, issue 30), while the
    /// digest is read only per session, digest round and status query.
    var maintainedDigest: StateDigest?
    /// Which records hold which dots (RecordMap+DotIndex.swift), kept with the digest: replica
    /// states have one, deltas built to be shipped do not.
    var dotIndex: DotIndex?
    /// The stable context this state was compacted with (``purge(stable:limit:)``); local
    /// bookkeeping, not part of the state (not in `==`, the digest or the encoding).
    public internal(set) var compactedThrough = CausalContext()

    /// Digest of the canonical state: the fields and presence entries of every *visible* record,
    /// and the context. Deleted records are left out: whether a replica still holds one or has
    /// purged it (compaction, ARCHITECTURE.md) is local bookkeeping that must not make two
    /// replicas holding the same events look different.
    ///
    /// - Complexity: O(replicas of the context) for replica states; O(size) for a delta built
    ///   without a maintained digest.
    public var digest: StateDigest {
        var digest = maintainedDigest ?? RecordMap(records: allRecords, context: context, maintainingDigest: true).maintainedDigest!
        for (replica, counter) in context.versionVector { digest.add(Self.contextEntryHash(replica, counter, inCloud: false)) }
        return digest
    }

    public init() {
        collections = [:]
        context = CausalContext()
        maintainedDigest = .empty
        dotIndex = DotIndex()
    }

    /// A state from parts (the store loads replicas this way; the wire decodes deltas this way).
    /// With `maintainingDigest` (the default) the digest is computed now and kept current by
    /// every later change; without, a delta skips that work.
    public init(records: some Sequence<(RecordKey, RecordState)>, context: CausalContext, maintainingDigest: Bool = true) {
        collections = [:]
        self.context = context
        maintainedDigest = maintainingDigest ? .empty : nil
        for (key, state) in records where !state.isEmpty {
            collections[key.collection, default: [:]][key.id] = state
            if maintainingDigest, state.isVisible {
                for (name, register) in state.fields { maintainedDigest!.add(Self.hash(key, name, register)) }
                for (replica, entry) in state.presence { maintainedDigest!.add(Self.hash(key, replica, entry)) }
            }
        }
        if maintainingDigest {
            for replica in context.replicas { maintainedDigest!.add(Self.cloudHash(context, replica)) }
            dotIndex = DotIndex.build(collections)
        }
    }

    /// A state (a delta, without a maintained digest) from records already grouped the way a
    /// map holds them: collection → record ID → state. Empty records and collections are
    /// dropped. Decoders build deltas this way, hashing each record once.
    public init(collections: [String: [UUID: RecordState]], context: CausalContext) {
        self.collections = collections
        self.context = context
        maintainedDigest = nil
        for (collection, records) in collections {
            if records.isEmpty {
                self.collections[collection] = nil
            } else if records.values.contains(where: \.isEmpty) {
                self.collections[collection] = records.filter { !$0.value.isEmpty }
                if self.collections[collection]?.isEmpty == true { self.collections[collection] = nil }
            }
        }
    }

    public func record(_ key: RecordKey) -> RecordState? {
        collections[key.collection]?[key.id]
    }

    /// All records of `collection`, visible or not.
    public func records(in collection: String) -> [UUID: RecordState] {
        collections[collection] ?? [:]
    }

    /// Every record with its key, in no particular order.
    public var allRecords: [(RecordKey, RecordState)] {
        collections.flatMap { collection, records in
            records.map { (RecordKey(collection: collection, id: $0.key), $0.value) }
        }
    }

    /// Number of records held (visible or not).
    public var recordCount: Int { collections.values.reduce(0) { $0 + $1.count } }

    /// Number of field registers held.
    public var fieldCount: Int {
        collections.values.reduce(0) { $0 + $1.values.reduce(0) { $0 + $1.fields.count } }
    }

    /// The newest write timestamp anywhere in this state.
    public var maxTimestamp: HLCTimestamp {
        var result = HLCTimestamp.zero
        for records in collections.values {
            for state in records.values { result.merge(state.maxTimestamp) }
        }
        return result
    }

    // MARK: - Mutators

    /// Writes `fields` of the record `key` as one event of `replica` at `time`, marking the
    /// record present. Returns the delta, already applied to `self`.
    ///
    /// `time` should come from the replica's hybrid logical clock, which has observed every
    /// timestamp in this state, so the write wins over all it replaces. (A `time` that is not
    /// later than a field's current value makes a write that loses to it; it records that it
    /// superseded nothing, since a register's `supersedes` is always older than its timestamp.)
    ///
    /// - Throws: ``CounterExhaustedError`` (and changes nothing) if `replica` has no counter left.
    @discardableResult
    public mutating func write(
        _ fields: [String: FieldValue], to key: RecordKey, at time: HLCTimestamp, by replica: ReplicaID
    ) throws(CounterExhaustedError) -> RecordMap {
        let dot = try context.nextDot(for: replica)
        let existing = record(key)
        var state = RecordState()
        for (name, value) in fields {
            let replaced = existing?.fields[name]?.timestamp ?? .zero
            state.fields[name] = FieldRegister(
                value: value, timestamp: time, dot: dot, supersedes: replaced < time ? replaced : .zero)
        }
        state.presence[replica] = PresenceEntry(counter: dot.counter, removedBy: nil)
        var delta = RecordMap.withoutDigest()
        delta.insert(key, state)
        delta.setContext(CausalContext(dots: [dot]))
        apply(delta)
        return delta
    }

    /// An empty map that does not maintain a digest, for building deltas by joining.
    public static func empty() -> RecordMap { withoutDigest() }

    /// An empty map that does not maintain a digest (for building deltas).
    static func withoutDigest() -> RecordMap {
        var map = RecordMap()
        map.maintainedDigest = nil
        map.dotIndex = nil
        return map
    }

    /// Deletes the record `key` as one event of `replica`: kills every live presence entry
    /// observed here. Returns the delta, or nil if the record is not visible.
    ///
    /// - Throws: ``CounterExhaustedError`` (and changes nothing) if `replica` has no counter left.
    @discardableResult
    public mutating func remove(_ key: RecordKey, by replica: ReplicaID) throws(CounterExhaustedError) -> RecordMap? {
        guard let existing = record(key), existing.isVisible else { return nil }
        let dot = try context.nextDot(for: replica)
        var state = RecordState()
        for (writer, entry) in existing.presence where entry.isLive {
            state.presence[writer] = PresenceEntry(counter: entry.counter, removedBy: dot)
        }
        var delta = RecordMap.withoutDigest()
        delta.insert(key, state)
        delta.setContext(CausalContext(dots: [dot]))
        apply(delta)
        return delta
    }

    // MARK: - Join

    /// Joins `delta` (a delta or a whole state) into `self` and reports what changed.
    ///
    /// - Complexity: O(size of `delta`).
    @discardableResult
    public mutating func apply(_ delta: RecordMap) -> MergeOutcome {
        var outcome = MergeOutcome()
        // Room for a large delta's records up front (a catch-up chunk, a whole state). Not for a
        // delta of a few records (a stream of one-field edits): `Set.reserveCapacity` runs
        // unspecialized in the standard library (generic metadata lookups, a resize) and cost
        // 13 % of W2's in-memory apply, while the first insert allocates anyway (issue 30).
        let incomingRecords = delta.recordCount
        if incomingRecords > Self.reserveOutcomeAbove {
            outcome.changedRecords.reserveCapacity(incomingRecords)
        }
        // A compacted state never takes back a record it purged (RecordMap+Compaction); decided
        // against the state before this join, while the dot index is in place.
        let echoes = compactedThrough.isEmpty ? [] : purgedEchoes(in: delta)
        outcome.droppedEchoes = echoes
        joinRecords(of: delta, skipping: echoes, into: &outcome)
        // After the join has ended: it holds the context as it was before, and while it lived
        // the context's dot cloud was shared, so merging into it copied the whole cloud
        // (O(cloud) per delta: building a 100k-record delta record by record was quadratic).
        mergeContext(delta.context)
        if dotIndex?.needsRebuild == true { dotIndex = DotIndex.build(collections) }
        return outcome
    }

    /// Joins `delta`'s records (not its context) into `self`, keeping the digest and dot index.
    private mutating func joinRecords(of delta: RecordMap, skipping echoes: Set<RecordKey>, into outcome: inout MergeOutcome) {
        var join = RecordJoin(seenBefore: context, digest: maintainedDigest, index: dotIndex)
        // Uniquely referenced while they change.
        maintainedDigest = nil
        dotIndex = nil
        for (collection, incomingRecords) in delta.collections {
            let slot = join.slot(of: collection)
            // Changed in place: one lookup of the collection (its dictionary stays uniquely
            // referenced while it changes; taking it out and putting it back hashed the name
            // twice and moved the entry twice per delta), then one lookup by ID per record.
            let emptied = Self.modify(&collections[collection, default: [:]]) { records in
                for (id, incoming) in incomingRecords {
                    let key = RecordKey(collection: collection, id: id)
                    if !echoes.isEmpty, echoes.contains(key) { continue }
                    join.record(key, slot: slot, incoming, into: &records[id], &outcome)
                }
                return records.isEmpty
            }
            if emptied { collections[collection] = nil }  // never holds empty collections
        }
        maintainedDigest = join.digest
        dotIndex = join.index
    }

    /// Deltas of more records than this reserve room in ``MergeOutcome``'s sets before the join.
    static let reserveOutcomeAbove = 16

    /// Runs `body` on `value` in place (through the accessor's `_modify`: no copy).
    @inline(__always)
    private static func modify<T, R>(_ value: inout T, _ body: (inout T) -> R) -> R { body(&value) }

    // MARK: - Anti-entropy

    /// What a replica whose context is `peer` lacks: every field written and every presence
    /// entry added or killed by an event the peer has not seen, plus this state's context.
    ///
    /// Removals travel as killed presence entries, so the context can be sent whole (it is a
    /// version vector, O(replicas)). For an empty `peer` this is the full state.
    ///
    /// - Complexity: O(events the peer lacks + replicas) with the dot index replica states keep
    ///   (``deltaByFullWalk(missingFrom:)``, O(records held), without one); the result is
    ///   O(what the peer lacks + replicas).
    public func delta(missingFrom peer: CausalContext) -> RecordMap {
        if peer.isEmpty { return self }  // a new peer lacks everything: share the state, copy nothing
        // Nor does a peer that has seen no event of any writer here (a new device holding only
        // its own roster entries): every register and presence entry here is news to it.
        if peer.replicas.isDisjoint(with: context.replicas) { return self }
        if let dotIndex, !dotIndex.overflowed { return indexedDelta(missingFrom: peer, index: dotIndex) }
        return deltaByFullWalk(missingFrom: peer)
    }

    /// Whether this state holds nothing (no records and an empty context).
    public var isEmpty: Bool { collections.isEmpty && context.isEmpty }

    // MARK: - Building deltas

    /// Adds a record state known not to be present yet (building deltas and extracts).
    mutating func insert(_ key: RecordKey, _ state: RecordState) {
        precondition(record(key) == nil)
        collections[key.collection, default: [:]][key.id] = state
        dotIndex?.addAll(of: state, key)
        guard maintainedDigest != nil, state.isVisible else { return }
        for (name, register) in state.fields { maintainedDigest!.add(Self.hash(key, name, register)) }
        for (replica, entry) in state.presence { maintainedDigest!.add(Self.hash(key, replica, entry)) }
    }

    mutating func setContext(_ newContext: CausalContext) {
        guard maintainedDigest != nil else {
            context = newContext
            return
        }
        for replica in context.replicas { maintainedDigest!.remove(Self.cloudHash(context, replica)) }
        context = newContext
        for replica in context.replicas { maintainedDigest!.add(Self.cloudHash(context, replica)) }
    }
}

extension RecordMap: AntiEntropyCRDT {
    public mutating func merge(_ other: RecordMap) { apply(other) }
}

extension RecordMap: Equatable {
    /// States are equal when their records and contexts are; the digest is derived.
    public static func == (lhs: RecordMap, rhs: RecordMap) -> Bool {
        lhs.context == rhs.context && lhs.collections == rhs.collections
    }
}

/// Two concurrent writes to one field met; `winner` is kept, `loser` is reported.
package struct FieldConflict: Hashable, Sendable {
    public let key: RecordKey
    public let field: String
    public let winner: FieldRegister
    public let loser: FieldRegister

    public init(key: RecordKey, field: String, winner: FieldRegister, loser: FieldRegister) {
        self.key = key
        self.field = field
        self.winner = winner
        self.loser = loser
    }
}

/// What one ``RecordMap/apply(_:)`` changed.
package struct MergeOutcome: Sendable {
    /// Field registers replaced or added.
    public internal(set) var changedFieldCount = 0
    /// Presence entries changed (records created, deleted or revived).
    public internal(set) var changedPresenceCount = 0
    public internal(set) var conflicts: [FieldConflict] = []
    /// Records whose values or visibility changed.
    public internal(set) var changedRecords: Set<RecordKey> = []
    /// Records whose state changed in any way: ``changedRecords`` and those where only presence
    /// entries moved (a delete observed again, a write of the same values). What a store
    /// rewrites; a record sent again unchanged (a duplicate from a second peer) is not here.
    public var changedStates: Set<RecordKey> {
        presenceOnlyChanges.isEmpty ? changedRecords : changedRecords.union(presenceOnlyChanges)
    }
    /// Records where only presence entries moved (most joins have none): kept apart so that a
    /// join of a one-record delta fills one set, not two (two set allocations and two hashed
    /// inserts were a sixth of W2's in-memory apply, issue 30).
    var presenceOnlyChanges: Set<RecordKey> = []
    /// The newest field timestamp seen in the delta (for the receiver's clock).
    public internal(set) var maxTimestamp: HLCTimestamp = .zero
    /// Records of the delta not joined because they echo records this state purged
    /// (RecordMap+Compaction: every dot in the stable context it compacted with).
    public internal(set) var droppedEchoes: Set<RecordKey> = []

    public init() {}

    public var isEmpty: Bool { changedFieldCount == 0 && changedPresenceCount == 0 }

    /// Adds what another apply changed.
    public mutating func absorb(_ other: MergeOutcome) {
        changedFieldCount += other.changedFieldCount
        changedPresenceCount += other.changedPresenceCount
        conflicts += other.conflicts
        changedRecords.formUnion(other.changedRecords)
        presenceOnlyChanges.formUnion(other.presenceOnlyChanges)
        maxTimestamp.merge(other.maxTimestamp)
        droppedEchoes.formUnion(other.droppedEchoes)
    }
}
