@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import PeerSyncWire

/// What one session still has to send. Control messages are *state*, not a queue (one pending
/// pong, one ack and one digest at most), so a peer that never reads costs bounded memory;
/// deltas are joined into one pending delta up to a byte budget, beyond which they are dropped
/// for one catch-up round computed later from what the peer is known to have.
struct OutboundQueue {
    /// The hello, until it is sent (always first).
    var hello: Hello?
    /// This side's auth signature, once the peer's hello arrived.
    var auth: [UInt8]?
    /// Sent with the auth: the peer's store was restored (PROTOCOL §6.9).
    var authLostSince: UInt64?
    /// The roster entries that admit this device, the admitting one first: a joiner's enrol for
    /// its inviter (its first message after auth), or a member's proof of admission for a peer
    /// that may lack it (PROTOCOL.md §6.4).
    var join: [[UInt8]]?
    var pong: UInt64?
    var ping: UInt64?
    var ackDue = false
    var digestDue = false
    /// Send the compaction gossip if it changed (it also rides with every ack and digest).
    var gossipDue = false
    /// Send our digest breakdown (a divergence was found).
    var breakdownDue = false
    /// Local and forwarded deltas not sent yet, oldest first. Each goes as its own frame (a local
    /// write in the event form is smaller than in a joined general-form delta; several frames
    /// share one write and one TLS record); past ``separateDeltaLimit`` they are joined into one.
    var pendingDeltas: [RecordMap] = []
    var deltaBytes = 0
    static let separateDeltaLimit = 16

    /// The pending deltas joined into one (nil if none).
    var joinedDeltas: RecordMap? {
        guard var joined = pendingDeltas.first else { return nil }
        for delta in pendingDeltas.dropFirst() { joined.merge(delta) }
        return joined
    }
    /// Deltas were dropped: send `state.delta(missingFrom: delivered)` instead.
    var resync = false
    /// The catch-up round being sent, then at most one waiting (a newer one replaces it).
    var catchUp: CatchUpRound?
    var nextCatchUp: RecordMap?
    /// The waiting round is complete (PROTOCOL §6.5): the stable context its first chunk names.
    var nextCatchUpStable: CausalContext?
    /// The last message before closing (error or goodbye); nothing is sent after it.
    var final: Message?
    /// Send pending deltas before `final` (a goodbye on shutdown); an error goes out at once.
    var flushBeforeFinal = false

    var hasWork: Bool {
        hello != nil || auth != nil || join != nil || pong != nil || ping != nil || ackDue || digestDue || breakdownDue || !pendingDeltas.isEmpty || resync
            || catchUp != nil || nextCatchUp != nil || final != nil
    }

    /// Queues a delta; returns false if the budget overflowed and a resync replaces the deltas.
    @discardableResult
    mutating func push(delta: RecordMap, limit: Int) -> Bool {
        if resync { return false }
        let size = delta.approximateWireBytes
        if deltaBytes + size > limit {
            pendingDeltas = []
            deltaBytes = 0
            resync = true
            return false
        }
        if pendingDeltas.count >= Self.separateDeltaLimit, var joined = joinedDeltas {
            joined.merge(delta)
            pendingDeltas = [joined]
        } else {
            pendingDeltas.append(delta)
        }
        deltaBytes += size
        return true
    }

    /// Queues a catch-up round. A round waiting behind the current one is joined with it
    /// (`replacing`: superseded, for full-state snapshots). `stable`: the round is complete —
    /// every record this side holds — for a peer behind the stable context it compacted with.
    mutating func push(catchUp state: RecordMap, replacing: Bool = false, stable: CausalContext? = nil) {
        if catchUp == nil {
            catchUp = CatchUpRound(state, stable: stable)
        } else if replacing || nextCatchUp == nil {
            nextCatchUp = state
            nextCatchUpStable = stable
        } else {
            nextCatchUp!.merge(state)
            if stable != nil { nextCatchUpStable = stable }
        }
    }

    /// The waiting round becomes the current one.
    mutating func startNextCatchUp() {
        guard catchUp == nil, let next = nextCatchUp else { return }
        catchUp = CatchUpRound(next, stable: nextCatchUpStable)
        nextCatchUp = nil
        nextCatchUpStable = nil
    }
}

/// A catch-up round in progress: the records of one extract, cut into chunks as they are sent.
///
/// The chunk count is fixed when the round starts (every chunk names it), so the cuts are
/// computed up front from size *bounds* that hold for the dictionary as it will be — it only
/// grows — which guarantees every chunk fits the peer's frame limit. A record too large for one
/// frame is split by fields (each field is an independent register) into parts that travel in
/// chunks of their own; a single field too large for the peer's frames cannot reach it and is
/// reported in `skipped`.
struct CatchUpRound {
    let context: CausalContext
    /// A complete round: the stable context the sender compacted with, sent in the first chunk.
    private(set) var stable: CausalContext?
    private let source: RecordMap
    private(set) var items: [(RecordKey, RecordState)] = []
    private(set) var cuts: [Range<Int>] = []
    var nextChunk = 0
    private(set) var skipped: [(RecordKey, field: String)] = []
    /// Items of system collections (the roster), which come first; known once planned.
    private var systemItems = 0
    private let hasSystemRecords: Bool

    init(_ state: RecordMap, stable: CausalContext? = nil) {
        context = state.context
        self.stable = stable
        source = state
        hasSystemRecords = state.collections.keys.contains { $0.hasPrefix("_") }
    }

    /// Whether live deltas must wait: the round's roster records have not all been sent yet. A
    /// receiver refuses writes by a replica ID no device claims (PROTOCOL §11), and the claims a
    /// live delta's writers need — a new peer's first round carries the sender's whole roster —
    /// must reach it first.
    var holdsDeltasBack: Bool {
        guard hasSystemRecords else { return false }
        guard isPlanned else { return true }
        return nextChunk == 0 || cuts[nextChunk - 1].upperBound < systemItems
    }

    var isPlanned: Bool { !cuts.isEmpty }
    var isFinished: Bool { isPlanned && nextChunk >= cuts.count }
    var chunkCount: Int { cuts.count }

    /// Cuts the records into chunks whose encoded frames stay at or below `limit` bytes.
    mutating func plan(limit: Int, dictionary: WireDictionary) {
        // System collections (names starting with "_", e.g. the roster) go first, so entries
        // that authorise later ones arrive before them. Within a collection, records go in the
        // order the encoder writes them (by base dot): a chunk then holds consecutive writes,
        // whose bases differ by a byte each (in hash order a chunk of 500 records out of
        // 100,000 spreads over every writer and counter: 2-3 more bytes per record). The sort
        // is by precomputed keys: comparing records themselves cost more than encoding them
        // (sync-initial, 10k records: 214 ms to the first chunk).
        let system = source.collections.keys.filter { $0.hasPrefix("_") }.sorted()
        let others = source.collections.keys.filter { !$0.hasPrefix("_") }.sorted()
        // Only the last chunk carries the round's context: the others may use the whole frame.
        // (A round's context can be large — a batch of 33,000 writes is a cloud of 33,000 dots
        // when it does not start at counter 1 — and taking it off every chunk's budget once
        // left no room for any field.)
        let budget = limit - WireDelta.chunkOverheadBound
        let contextBound = WireDelta.contextSizeBound(context, with: dictionary)
        // A complete round's first chunk also carries the stable context (a field of the chunk).
        // One that would not fit a frame is not sent: the round goes as an ordinary one.
        var stableBound = 0
        if let stable {
            stableBound = stable.encodedBlob().count + 16
            if stableBound >= budget {
                self.stable = nil
                stableBound = 0
            }
        }
        var alone = Set<Int>()
        var bounds: [Int] = []
        items.reserveCapacity(source.recordCount)
        bounds.reserveCapacity(source.recordCount)
        for collection in system + others {
            if collection == others.first { systemItems = items.count }
            let records = source.collections[collection]!
            let ordered = records.count < 2 ? Array(records)
                : records.map { (order: WireDelta.sendOrder(of: $0.value), record: $0) }.sorted { $0.order < $1.order }.map(\.record)
            for (id, state) in ordered {
                let key = RecordKey(collection: collection, id: id)
                let bound = WireDelta.encodedSizeBound(of: key, state, with: dictionary)
                if bound <= budget {
                    items.append((key, state))
                    bounds.append(bound)
                    continue
                }
                for part in split(key, state, budget: budget, dictionary: dictionary) {
                    alone.insert(items.count)
                    items.append((key, part))
                    bounds.append(WireDelta.encodedSizeBound(of: key, part, with: dictionary))
                }
            }
        }
        if others.isEmpty { systemItems = items.count }
        var start = 0
        var size = stableBound
        if let first = bounds.first, stableBound > 0, stableBound + first > budget {
            cuts.append(0..<0)  // the stable context alone in the first chunk
            size = 0
        }
        for index in items.indices {
            let bound = bounds[index]
            if index > start && (size + bound > budget || alone.contains(index) || alone.contains(index - 1)) {
                cuts.append(start..<index)
                start = index
                size = 0
            }
            size += bound
        }
        if items.count > start && size + contextBound > budget {
            // The context does not fit beside the last records: it goes alone, in a last chunk
            // without records.
            cuts.append(start..<items.count)
            start = items.count
        }
        cuts.append(start..<items.count)
    }

    /// The parts of a record too large for one chunk: fields grouped greedily; presence rides
    /// with the first part.
    private mutating func split(_ key: RecordKey, _ state: RecordState, budget: Int, dictionary: WireDictionary) -> [RecordState] {
        var parts: [RecordState] = []
        var fields: SortedMap<String, FieldRegister> = SortedMap()
        var presence = state.presence
        for (name, register) in state.fields {
            let single = RecordState(fields: [name: register])
            if WireDelta.encodedSizeBound(of: key, single, with: dictionary) > budget {
                skipped.append((key, name))
                continue
            }
            var candidate = fields
            candidate[name] = register
            if WireDelta.encodedSizeBound(of: key, RecordState(fields: candidate, presence: presence), with: dictionary) > budget {
                if !fields.isEmpty || !presence.isEmpty { parts.append(RecordState(fields: fields, presence: presence)) }
                fields = [name: register]
                presence = [:]
            } else {
                fields = candidate
            }
        }
        let current = RecordState(fields: fields, presence: presence)
        if !current.fields.isEmpty || !current.presence.isEmpty { parts.append(current) }
        return parts
    }

    /// The next chunk's records; the last chunk carries the round's context.
    mutating func nextSlice() -> (records: ArraySlice<(RecordKey, RecordState)>, index: Int, isLast: Bool) {
        let index = nextChunk
        nextChunk += 1
        return (items[cuts[index]], index, index + 1 == cuts.count)
    }
}

extension RecordMap {
    /// A cheap estimate of this delta's encoded size, for queue accounting.
    var approximateWireBytes: Int {
        var total = 16 + context.replicaCount * 24
        for (_, records) in collections {
            for (_, state) in records {
                total += 24 + state.presence.count * 12
                for register in state.fields.values { total += 20 + register.value.encodedSize }
            }
        }
        return total
    }
}
