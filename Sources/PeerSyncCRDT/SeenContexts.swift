/// What every replica has seen, as far as this replica knows: for each replica ID, the causal
/// context it last reported, and the stable context (``CompactionFrontier/stable``) known here.
///
/// It is what compaction gossip carries: a replica records its own context, joins what peers
/// send, and passes the result on, so every replica learns about every device without meeting
/// it. A report only grows (a replica's context only grows), so the join is per-replica union,
/// and stable contexts join by union (see ``CompactionFrontier/merge(_:)``): a join-semilattice.
public struct SeenContexts: Sendable, Hashable, JoinSemilattice {
    /// replica → the context it reported (never empty).
    public private(set) var reports: [ReplicaID: CausalContext]
    /// Dots known to be stable.
    public private(set) var stable: CausalContext

    public init(reports: [ReplicaID: CausalContext] = [:], stable: CausalContext = CausalContext()) {
        self.reports = reports.filter { !$0.value.isEmpty }
        self.stable = stable
    }

    /// Records that `replica` has seen `context` (joined with what it reported before).
    public mutating func record(_ replica: ReplicaID, seen context: CausalContext) {
        if context.isEmpty { return }
        reports[replica, default: CausalContext()].merge(context)
    }

    /// Records stable dots.
    public mutating func recordStable(_ context: CausalContext) {
        stable.merge(context)
    }

    public mutating func merge(_ other: SeenContexts) {
        for (replica, context) in other.reports { record(replica, seen: context) }
        stable.merge(other.stable)
    }

    /// What a peer already told `told` (everything earlier `seen` messages to it carried) has
    /// not been told yet: each report's entries that changed since, and the stable context's —
    /// leaving out the reports of replicas for which `skip` is true (the peer's own, and those of
    /// replicas it has sessions with: it hears those from them). Nil if nothing.
    /// Reports and stable contexts join by union, so these pieces joined by the receiver give
    /// what the whole would.
    ///
    /// - Complexity: O(reports × replicas per report).
    public func news(since told: SeenContexts, skipping skip: (ReplicaID) -> Bool) -> SeenContexts? {
        var news = SeenContexts()
        for (replica, context) in reports where !skip(replica) {
            let changed = context.entriesChanged(since: told.reports[replica] ?? CausalContext())
            if !changed.isEmpty { news.reports[replica] = changed }
        }
        news.stable = stable.entriesChanged(since: told.stable)
        return news.reports.isEmpty && news.stable.isEmpty ? nil : news
    }

    /// Drops the reports of replicas for which `keep` is false (replicas of removed devices,
    /// older incarnations), so the map stays bounded by the roster.
    public mutating func retain(_ keep: (ReplicaID) -> Bool) {
        reports = reports.filter { keep($0.key) }
    }

    /// The binary form (gossip message body and store blob): version byte 1, the number of
    /// reports, then each report as a replica ID (16 bytes) and a context blob (length-prefixed),
    /// in ascending replica order; then the stable context blob (length-prefixed).
    public func encodedBlob() -> [UInt8] {
        var out: [UInt8] = [1]
        Varint.append(UInt64(reports.count), to: &out)
        for (replica, context) in reports.sorted(by: { $0.key < $1.key }) {
            replica.appendBigEndianBytes(to: &out)
            let blob = context.encodedBlob()
            Varint.append(UInt64(blob.count), to: &out)
            out += blob
        }
        let blob = stable.encodedBlob()
        Varint.append(UInt64(blob.count), to: &out)
        out += blob
        return out
    }

    /// Reads ``encodedBlob()``. Refuses an unknown version, more reports than
    /// ``ValidationLimits/maxContextReplicas``, replicas out of order, a context past the
    /// context limits, and trailing bytes.
    public init(blob: [UInt8]) throws(BinaryDecodingError) {
        var index = 0
        func take(_ count: Int, _ what: String) throws(BinaryDecodingError) -> ArraySlice<UInt8> {
            guard count >= 0, blob.count - index >= count else { throw .truncated(what) }
            defer { index += count }
            return blob[index..<(index + count)]
        }
        func varint(_ what: String) throws(BinaryDecodingError) -> UInt64 {
            var value: UInt64 = 0
            var shift: UInt64 = 0
            while true {
                guard index < blob.count else { throw .truncated(what) }
                let byte = blob[index]
                index += 1
                guard shift < 64 else { throw .invalid("\(what): varint too long") }
                value |= UInt64(byte & 0x7f) << shift
                if byte & 0x80 == 0 { return value }
                shift += 7
            }
        }
        func context(_ what: String) throws(BinaryDecodingError) -> CausalContext {
            let length = try varint(what)
            guard length <= UInt64(blob.count - index) else { throw .truncated(what) }
            let decoded = try CausalContext(blob: Array(try take(Int(length), what)))
            if let violation = decoded.limitViolation { throw .invalid("\(what): \(violation)") }
            return decoded
        }
        guard let version = blob.first else { throw .truncated("seen contexts") }
        guard version == 1 else { throw .unsupportedVersion(version) }
        index = 1
        let count = try varint("seen contexts: count")
        guard count <= UInt64(ValidationLimits.maxContextReplicas) else {
            throw .invalid("seen contexts: \(count) reports (limit \(ValidationLimits.maxContextReplicas))")
        }
        var reports: [ReplicaID: CausalContext] = [:]
        var last: ReplicaID?
        for _ in 0..<count {
            guard let replica = ReplicaID(bigEndianBytes: try take(16, "seen contexts: replica")) else {
                throw .truncated("seen contexts: replica")
            }
            if let last, !(last < replica) { throw .invalid("seen contexts: replicas not in ascending order") }
            last = replica
            reports[replica] = try context("seen contexts: context of \(replica.shortDescription)")
        }
        let stable = try context("seen contexts: stable context")
        guard index == blob.count else { throw .invalid("seen contexts: \(blob.count - index) trailing bytes") }
        self.init(reports: reports, stable: stable)
    }
}
