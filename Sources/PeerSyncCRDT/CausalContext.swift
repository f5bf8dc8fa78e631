/// The set of dots a replica has seen: a version vector plus a small "dot cloud".
///
/// The version vector maps a replica to the highest counter `n` such that all of `1...n`
/// were seen. Dots seen out of order wait in the cloud and move into the vector as the gaps
/// fill, so the representation is canonical: two contexts holding the same dots are `==`.
///
/// `merge(_:)` is set union, a join-semilattice.
public struct CausalContext: Hashable, Sendable {
    /// replica → highest contiguous counter (never 0; absent means none seen).
    public private(set) var versionVector: [ReplicaID: UInt64]
    /// replica → counters above the vector's entry, seen out of order (never empty sets).
    public private(set) var dotCloud: [ReplicaID: Set<UInt64>]

    public init() {
        versionVector = [:]
        dotCloud = [:]
    }

    /// A context holding exactly `1...counter` for each listed replica.
    public init(versionVector: [ReplicaID: UInt64]) {
        self.versionVector = versionVector.filter { $0.value > 0 }
        dotCloud = [:]
    }

    /// A context holding exactly `dots`.
    public init<S: Sequence>(dots: S) where S.Element == Dot {
        self.init()
        for dot in dots { insert(dot) }
    }

    public var isEmpty: Bool { versionVector.isEmpty && dotCloud.isEmpty }

    /// The highest counter `n` of `replica` such that all of `1...n` were seen.
    public func contiguousCounter(of replica: ReplicaID) -> UInt64 {
        versionVector[replica] ?? 0
    }

    /// The highest counter of `replica` seen at all (vector or cloud).
    public func maxCounter(of replica: ReplicaID) -> UInt64 {
        max(versionVector[replica] ?? 0, dotCloud[replica]?.max() ?? 0)
    }

    /// The replicas that have at least one dot here.
    public var replicas: Set<ReplicaID> {
        Set(versionVector.keys).union(dotCloud.keys)
    }

    /// Number of dots waiting in the cloud (a measure of metadata that has not compacted).
    public var cloudDotCount: Int { dotCloud.values.reduce(0) { $0 + $1.count } }

    /// - Complexity: O(1) on average.
    public func contains(_ dot: Dot) -> Bool {
        if dot.counter <= (versionVector[dot.replica] ?? 0) { return true }
        return dotCloud[dot.replica]?.contains(dot.counter) ?? false
    }

    /// The dot after the highest one `replica` has made.
    public func nextDot(for replica: ReplicaID) -> Dot {
        Dot(replica: replica, counter: maxCounter(of: replica) + 1)
    }

    /// Adds one dot, compacting the cloud into the vector where it closes a gap.
    public mutating func insert(_ dot: Dot) {
        let current = versionVector[dot.replica] ?? 0
        if dot.counter <= current { return }
        if dot.counter == current + 1 {
            versionVector[dot.replica] = dot.counter
            compact(dot.replica)
        } else {
            dotCloud[dot.replica, default: []].insert(dot.counter)
        }
    }

    /// Set union.
    public mutating func merge(_ other: CausalContext) {
        for (replica, counter) in other.versionVector where counter > (versionVector[replica] ?? 0) {
            versionVector[replica] = counter
            compact(replica)
        }
        for (replica, counters) in other.dotCloud {
            for counter in counters { insert(Dot(replica: replica, counter: counter)) }
        }
    }

    public func merged(with other: CausalContext) -> CausalContext {
        var copy = self
        copy.merge(other)
        return copy
    }

    /// Whether every dot of `other` is in `self`.
    public func includes(_ other: CausalContext) -> Bool {
        for (replica, counter) in other.versionVector where counter > (versionVector[replica] ?? 0) {
            for c in ((versionVector[replica] ?? 0) + 1)...counter where !(dotCloud[replica]?.contains(c) ?? false) {
                return false
            }
        }
        for (replica, counters) in other.dotCloud {
            for counter in counters where !contains(Dot(replica: replica, counter: counter)) { return false }
        }
        return true
    }

    /// How two contexts relate as sets of seen events.
    public func causalRelation(to other: CausalContext) -> CausalRelation {
        switch (includes(other), other.includes(self)) {
        case (true, true): .equal
        case (true, false): .happenedAfter
        case (false, true): .happenedBefore
        case (false, false): .concurrent
        }
    }

    /// Calls `body` for every (replica, counter) entry that defines this context, in no order:
    /// vector entries with `inCloud == false`, cloud dots with `inCloud == true`.
    public func forEachEntry(of replica: ReplicaID, _ body: (UInt64, Bool) -> Void) {
        if let counter = versionVector[replica] { body(counter, false) }
        if let cloud = dotCloud[replica] { for counter in cloud { body(counter, true) } }
    }

    private mutating func compact(_ replica: ReplicaID) {
        guard var cloud = dotCloud[replica] else { return }
        var top = versionVector[replica] ?? 0
        while cloud.remove(top + 1) != nil { top += 1 }
        cloud = cloud.filter { $0 > top }
        if top > 0 { versionVector[replica] = top }
        dotCloud[replica] = cloud.isEmpty ? nil : cloud
    }
}

/// How two sets of seen events (or the states they describe) relate.
public enum CausalRelation: Sendable, Equatable {
    case equal
    /// The left side saw a strict subset of what the right side saw.
    case happenedBefore
    /// The left side saw a strict superset of what the right side saw.
    case happenedAfter
    /// Each side saw something the other did not.
    case concurrent
}

extension CausalContext: JoinSemilattice {}
