/// Which records hold elements of which events, so that ``RecordMap/delta(missingFrom:)`` visits
/// only the records a peer lacks something of, not every record held.
///
/// Every element of a state carries dots: a field register its writer's dot, a presence entry
/// `(writer, counter)` and, once killed, its remover's dot. The index maps each such dot to the
/// record holding the element. A peer with context `C` lacks an element only if one of its dots
/// is not in `C`, so the records listed under the dots missing from `C` are the only ones that
/// can hold something the peer lacks; each of them is then checked element by element, exactly
/// as the full walk does.
///
/// Layout (chosen for memory: ``RecordMap`` states hold up to ~10⁵ records in ≤ 1 KB each):
/// replica → bucket of 64 consecutive counters → entries `(record ID, counter mod 64,
/// collection slot)`, 20 bytes each, unordered within a bucket. Adding an entry is O(1) in any
/// arrival order; finding what a peer lacks visits the buckets above the peer's version-vector
/// entry for each replica — O(events the peer lacks), not O(records held).
///
/// Entries are never removed when an element is overwritten (the new element gets its own
/// entry); a stale entry only makes extraction check a record that turns out to hold nothing
/// missing. When entries outnumber twice the live ones — the count after the last rebuild,
/// plus the entries of records new since (they are never stale) — the index is rebuilt from
/// the records (amortized O(1) per entry).
struct DotIndex: Sendable {
    /// One element's dot, as seen from its bucket: the record and the counter's low 6 bits.
    struct Entry: Sendable {
        let id: UUID
        let low: UInt8
        let collection: UInt16
    }

    /// The buckets of one replica's counters: `counter >> 6` → entries.
    struct Buckets: Sendable {
        var buckets: [UInt64: [Entry]] = [:]
        var highestBucket: UInt64 = 0
    }

    static let bucketShift: UInt64 = 6
    /// More collections than a slot can name: the index gives up and extraction walks.
    static let maxCollections = Int(UInt16.max)

    private(set) var collectionNames: [String] = []
    private var collectionSlots: [String: UInt16] = [:]
    private(set) var replicas: [ReplicaID: Buckets] = [:]
    private(set) var entryCount = 0
    /// Rebuild from the records once `entryCount` passes this.
    private var rebuildAt = 4_096
    /// Set when collections overflowed the slots: the owner falls back to the full walk.
    private(set) var overflowed = false

    init() {}

    /// The slot of `collection`, adding it if new (nil when slots are exhausted).
    mutating func slot(of collection: String) -> UInt16? {
        if let slot = collectionSlots[collection] { return slot }
        guard collectionNames.count < Self.maxCollections else {
            overflowed = true
            return nil
        }
        let slot = UInt16(collectionNames.count)
        collectionNames.append(collection)
        collectionSlots[collection] = slot
        return slot
    }

    /// Notes that record `key` holds an element with `dot`.
    mutating func add(_ dot: Dot, _ key: RecordKey) {
        guard !overflowed, let slot = slot(of: key.collection) else { return }
        add(dot, id: key.id, slot: slot)
    }

    /// Notes that record `id` of the collection in `slot` holds an element with `dot`.
    mutating func add(_ dot: Dot, id: UUID, slot: UInt16) {
        let bucket = dot.counter >> Self.bucketShift
        let entry = Entry(id: id, low: UInt8(truncatingIfNeeded: dot.counter & 63), collection: slot)
        // In place: the replica's buckets and the bucket array stay uniquely referenced.
        modify(&replicas[dot.replica, default: Buckets()]) { buckets in
            buckets.buckets[bucket, default: []].append(entry)
            if bucket > buckets.highestBucket { buckets.highestBucket = bucket }
        }
        entryCount += 1
    }

    /// Notes every dot of `state`'s elements, once each.
    mutating func addAll(of state: RecordState, _ key: RecordKey) {
        guard !overflowed, let slot = slot(of: key.collection) else { return }
        addAll(of: state, id: key.id, slot: slot)
    }

    private mutating func addAll(of state: RecordState, id: UUID, slot: UInt16) {
        var seen = DotSet()
        state.forEachDot { dot in
            if seen.insert(dot) { add(dot, id: id, slot: slot) }
        }
    }

    /// Notes every dot of a record the map did not hold: its entries cannot be stale (no older
    /// element of the record is indexed), so they raise the threshold as a rebuild would have,
    /// by twice their number — a fresh peer's catch-up, all new records, then builds the index
    /// once instead of every time it doubles. (Raising it by their number alone rebuilt a
    /// 10k-record map after its first 4,096 overwrites, inside W3's heal.)
    mutating func addNew(_ state: RecordState, id: UUID, slot: UInt16) {
        let before = entryCount
        addAll(of: state, id: id, slot: slot)
        rebuildAt += 2 * (entryCount - before)
    }

    /// Calls `body` with every record listed under `dot` (entries may be stale: the record may
    /// no longer hold it). False if the index cannot answer (its collections overflowed).
    func forEachRecord(listing dot: Dot, _ body: (String, UUID) -> Void) -> Bool {
        guard !overflowed else { return false }
        let low = UInt8(truncatingIfNeeded: dot.counter & 63)
        for entry in replicas[dot.replica]?.buckets[dot.counter >> Self.bucketShift] ?? [] where entry.low == low {
            body(collectionNames[Int(entry.collection)], entry.id)
        }
        return true
    }

    /// Whether the index has grown enough stale entries to be worth rebuilding.
    var needsRebuild: Bool { entryCount > rebuildAt }

    /// The index of `collections` from scratch.
    static func build(_ collections: [String: [UUID: RecordState]]) -> DotIndex {
        var index = DotIndex()
        for (collection, records) in collections {
            for (id, state) in records { index.addAll(of: state, RecordKey(collection: collection, id: id)) }
        }
        index.rebuildAt = max(4_096, index.entryCount * 2)
        return index
    }

    /// At least the number of calls ``forEachRecord(lacking:_:)`` makes for `peer` (every entry
    /// in a bucket it visits), for reserving room for the records found.
    func entryBound(lacking peer: CausalContext) -> Int {
        var total = 0
        forEachBucket(lacking: peer) { _, entries, _, _ in total += entries.count }
        return total
    }

    /// Calls `body` with (collection slot, record ID) for every entry whose dot is not in `peer`
    /// (a record may come several times); ``collectionNames`` names the slots.
    ///
    /// - Complexity: O(buckets at or above the peer's contiguous counter, per replica), bounded
    ///   by the buckets held.
    func forEachRecord(lacking peer: CausalContext, _ body: (Int, UUID) -> Void) {
        var cloudOf: ReplicaID?
        var cloud: Set<UInt64>?
        forEachBucket(lacking: peer) { bucket, entries, replica, contiguous in
            if replica != cloudOf {
                cloudOf = replica
                cloud = peer.dotCloud[replica]
            }
            let base = bucket << Self.bucketShift
            for entry in entries {
                let counter = base | UInt64(entry.low)
                if counter <= contiguous { continue }
                if let cloud, cloud.contains(counter) { continue }
                body(Int(entry.collection), entry.id)
            }
        }
    }

    /// Calls `body` with every bucket (number, entries, replica, the peer's contiguous counter
    /// of that replica) at or above that counter: the buckets that can hold dots the peer lacks.
    private func forEachBucket(lacking peer: CausalContext, _ body: (UInt64, [Entry], ReplicaID, UInt64) -> Void) {
        for (replica, buckets) in replicas {
            let contiguous = peer.contiguousCounter(of: replica)
            let first = contiguous >> Self.bucketShift
            guard first <= buckets.highestBucket else { continue }
            if buckets.highestBucket - first < UInt64(buckets.buckets.count) {
                for bucket in first...buckets.highestBucket {
                    if let entries = buckets.buckets[bucket] { body(bucket, entries, replica, contiguous) }
                }
            } else {
                // Sparse counters (far apart): visiting the buckets held is cheaper than the range.
                for (bucket, entries) in buckets.buckets where bucket >= first { body(bucket, entries, replica, contiguous) }
            }
        }
    }
}

/// A few dots, deduplicated without hashing (a record's elements share one or two dots).
private struct DotSet {
    private var dots: [Dot] = []

    /// Inserts `dot`; false if it was there.
    mutating func insert(_ dot: Dot) -> Bool {
        if dots.contains(dot) { return false }
        dots.append(dot)
        return true
    }
}

/// Runs `body` on `value` in place.
@inline(__always)
private func modify<T>(_ value: inout T, _ body: (inout T) -> Void) { body(&value) }

extension RecordState {
    /// Calls `body` with the dot of every element: each field's writer dot, each presence entry's
    /// `(writer, counter)` and each remover (repeats included).
    func forEachDot(_ body: (Dot) -> Void) {
        for register in fields.values { body(register.dot) }
        for (replica, entry) in presence {
            body(Dot(replica: replica, counter: entry.counter))
            if let remover = entry.removedBy { body(remover) }
        }
    }

    /// The elements of this record that a replica with context `peer` lacks: fields whose dot
    /// it has not seen, presence entries whose add or removal it has not seen. The plain
    /// version: the full walk, the reference the indexed extraction is tested against, uses it.
    func missing(from peer: CausalContext) -> RecordState {
        func lacks(_ entry: (key: ReplicaID, value: PresenceEntry)) -> Bool {
            !peer.contains(Dot(replica: entry.key, counter: entry.value.counter))
                || !(entry.value.removedBy.map(peer.contains) ?? true)
        }
        if fields.values.allSatisfy({ !peer.contains($0.dot) }), presence.allSatisfy(lacks) { return self }
        var missing = RecordState()
        for (name, register) in fields where !peer.contains(register.dot) {
            missing.fields[name] = register
        }
        for entry in presence where lacks(entry) { missing.presence[entry.key] = entry.value }
        return missing
    }

    /// ``missing(from:)-(CausalContext)`` for the indexed extraction: the same answer, with
    /// the peer's context looked up through `peer`'s cache and the result built by appending.
    func missing(from peer: inout ContextLookup) -> RecordState {
        func lacks(_ entry: SortedMap<ReplicaID, PresenceEntry>.Entry) -> Bool {
            !peer.contains(Dot(replica: entry.key, counter: entry.value.counter))
                || !(entry.value.removedBy.map { peer.contains($0) } ?? true)
        }
        // A record the peer lacks whole (new to it) is shared, not copied element by element.
        if fields.entries.allSatisfy({ !peer.contains($0.value.dot) }), presence.entries.allSatisfy(lacks) { return self }
        // Otherwise the elements it lacks, appended in the order they are held (sorted).
        var missing = RecordState()
        for entry in fields.entries where !peer.contains(entry.value.dot) { missing.fields.entries.append(entry) }
        for entry in presence.entries where lacks(entry) { missing.presence.entries.append(entry) }
        return missing
    }
}

/// ``CausalContext/contains(_:)`` for many dots in a row, remembering the last replica's
/// entries: the elements of a record, and the records an extraction visits in turn, mostly
/// share a writer, so most answers hash nothing (two dictionary lookups per dot before: 1/3 of
/// an extraction).
struct ContextLookup {
    let context: CausalContext
    /// The entries of the writers met so far (a record's elements come from a few writers, and
    /// so do the records of one extraction): a short scan, most often a hit on the last one.
    private var known: [Known] = []
    private var last = 0

    private struct Known {
        let replica: ReplicaID
        let contiguous: UInt64
        let cloud: Set<UInt64>?
    }

    /// Writers remembered; past this many (rare: one per writer of the records visited), the
    /// context answers directly.
    private static let capacity = 16

    init(_ context: CausalContext) { self.context = context }

    mutating func contains(_ dot: Dot) -> Bool {
        let entry: Known
        if last < known.count, known[last].replica == dot.replica {
            entry = known[last]
        } else if let i = known.firstIndex(where: { $0.replica == dot.replica }) {
            last = i
            entry = known[i]
        } else {
            entry = Known(replica: dot.replica, contiguous: context.contiguousCounter(of: dot.replica),
                          cloud: context.dotCloud.isEmpty ? nil : context.dotCloud[dot.replica])
            if known.count < Self.capacity {
                last = known.count
                known.append(entry)
            }
        }
        if dot.counter <= entry.contiguous { return true }
        return entry.cloud?.contains(dot.counter) ?? false
    }
}

extension RecordMap {
    /// ``delta(missingFrom:)`` through the dot index: visits only records listed under dots the
    /// peer lacks. Falls back to ``deltaByFullWalk(missingFrom:)`` for maps without an index
    /// (deltas built to be shipped).
    func indexedDelta(missingFrom peer: CausalContext, index: DotIndex) -> RecordMap {
        // Per collection slot: the records held and what was found (one lookup by ID each).
        let held = index.collectionNames.map { collections[$0] ?? [:] }
        var found = [[UUID: RecordState]](repeating: [:], count: held.count)
        // One collection (the common case): room for every record the index can list, so the
        // result never rehashes as it grows.
        if found.count == 1 { found[0].reserveCapacity(index.entryBound(lacking: peer)) }
        var lookup = ContextLookup(peer)
        index.forEachRecord(lacking: peer) { slot, id in
            // A record listed twice (a removal's dot, a stale entry) is checked again and gives
            // the same answer: cheaper than a lookup for every record to skip the rare repeat.
            guard let state = held[slot][id] else { return }
            let missing = state.missing(from: &lookup)
            if !missing.isEmpty { found[slot][id] = missing }
        }
        var grouped: [String: [UUID: RecordState]] = [:]
        for (slot, records) in found.enumerated() where !records.isEmpty { grouped[index.collectionNames[slot]] = records }
        return RecordMap(collections: grouped, context: context)
    }

    /// What a replica whose context is `peer` lacks, found by checking every record held: the
    /// reference the indexed ``delta(missingFrom:)`` must always equal (tests compare them).
    ///
    /// - Complexity: O(records held).
    public func deltaByFullWalk(missingFrom peer: CausalContext) -> RecordMap {
        var result = RecordMap.withoutDigest()
        for (collection, records) in collections {
            for (id, state) in records {
                let missing = state.missing(from: peer)
                if !missing.isEmpty { result.insert(RecordKey(collection: collection, id: id), missing) }
            }
        }
        result.setContext(context)
        return result
    }

    /// Whether this map keeps a dot index (replica states do; deltas built to ship do not).
    public var isIndexed: Bool { dotIndex.map { !$0.overflowed } ?? false }

    /// Entries in the dot index (0 without one), for measuring its size.
    public var dotIndexEntryCount: Int { dotIndex?.entryCount ?? 0 }
}
