/// The set of dots a replica has seen: a version vector plus a small "dot cloud".
///
/// The version vector maps a replica to the highest counter `n` such that all of `1...n`
/// were seen. Dots seen out of order wait in the cloud and move into the vector as the gaps
/// fill, so the representation is canonical: two contexts holding the same dots are `==`.
///
/// `merge(_:)` is set union, a join-semilattice.
package struct CausalContext: Hashable, Sendable {
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
    ///
    /// - Complexity: O(cloud dots of `replica`).
    public func maxCounter(of replica: ReplicaID) -> UInt64 {
        max(versionVector[replica] ?? 0, dotCloud[replica]?.max() ?? 0)
    }

    /// The replicas that have at least one dot here.
    public var replicas: Set<ReplicaID> {
        Set(versionVector.keys).union(dotCloud.keys)
    }

    /// Number of replicas that have at least one dot here.
    ///
    /// - Complexity: O(replicas with cloud dots).
    public var replicaCount: Int {
        versionVector.count + dotCloud.keys.reduce(0) { $0 + (versionVector[$1] == nil ? 1 : 0) }
    }

    /// Number of dots waiting in the cloud (a measure of metadata that has not compacted).
    public var cloudDotCount: Int { dotCloud.values.reduce(0) { $0 + $1.count } }

    /// - Complexity: O(1) on average.
    public func contains(_ dot: Dot) -> Bool {
        if dot.counter <= (versionVector[dot.replica] ?? 0) { return true }
        return dotCloud[dot.replica]?.contains(dot.counter) ?? false
    }

    /// The dot after the highest one `replica` has made.
    ///
    /// - Throws: ``CounterExhaustedError`` if that dot's counter would pass
    ///   ``ValidationLimits/maxCounter`` (only a hostile peer can bring a replica there).
    public func nextDot(for replica: ReplicaID) throws(CounterExhaustedError) -> Dot {
        let highest = maxCounter(of: replica)
        guard highest < ValidationLimits.maxCounter else { throw CounterExhaustedError(replica: replica) }
        return Dot(replica: replica, counter: highest + 1)
    }

    /// Whether `replica` can take another dot (its counter is below ``ValidationLimits/maxCounter``).
    public func canTakeDot(for replica: ReplicaID) -> Bool {
        maxCounter(of: replica) < ValidationLimits.maxCounter
    }

    /// Adds one dot, compacting the cloud into the vector where it closes a gap.
    ///
    /// - Complexity: O(1) on average, plus O(dots moved from the cloud to the vector).
    public mutating func insert(_ dot: Dot) {
        insert(dot) { _, _, _ in }
    }

    /// `insert(_:)`, telling `cloudChanged` (replica, counter, added) of every cloud dot it adds
    /// or removes; version vector changes are the caller's to compare.
    @inline(__always)
    mutating func insert(_ dot: Dot, cloudChanged: (ReplicaID, UInt64, Bool) -> Void) {
        let current = versionVector[dot.replica] ?? 0
        if dot.counter <= current { return }
        if dot.counter == current + 1 {  // no overflow: dot.counter > current
            versionVector[dot.replica] = dot.counter
            compact(dot.replica, coveredFrom: dot.counter, cloudChanged: cloudChanged)
        } else if dotCloud[dot.replica, default: []].insert(dot.counter).inserted {
            cloudChanged(dot.replica, dot.counter, true)
        }
    }

    /// Set union.
    ///
    /// - Complexity: O(size of `other`) plus O(dots that move from the cloud to the vector);
    ///   a vector entry of `other` that jumps past cloud dots here costs O(min(jump, cloud)).
    public mutating func merge(_ other: CausalContext) {
        merge(other) { _, _, _ in }
    }

    /// `merge(_:)`, telling `cloudChanged` (replica, counter, added) of every cloud dot it adds
    /// or removes, so that a digest over the cloud can follow in O(changes), not O(cloud).
    /// Version vector changes are the caller's to compare (only replicas of `other` change).
    @inline(__always)
    mutating func merge(_ other: CausalContext, cloudChanged: (ReplicaID, UInt64, Bool) -> Void) {
        for (replica, counter) in other.versionVector {
            let current = versionVector[replica] ?? 0
            guard counter > current else { continue }
            versionVector[replica] = counter
            compact(replica, coveredFrom: current + 1, cloudChanged: cloudChanged)
        }
        for (replica, counters) in other.dotCloud {
            for counter in counters { insert(Dot(replica: replica, counter: counter), cloudChanged: cloudChanged) }
        }
    }

    /// The one dot this context holds, if it holds exactly one (the context of a delta of one
    /// event); nil otherwise.
    var onlyDot: Dot? {
        if versionVector.isEmpty {
            guard dotCloud.count == 1, let (replica, counters) = dotCloud.first, counters.count == 1 else { return nil }
            return Dot(replica: replica, counter: counters.first!)
        }
        guard dotCloud.isEmpty, versionVector.count == 1, let (replica, counter) = versionVector.first, counter == 1 else { return nil }
        return Dot(replica: replica, counter: 1)
    }

    /// Inserts `dot` if it is the next counter of its replica's vector entry and that replica
    /// has no cloud dots (then `insert(_:)` would only move the entry up by one); returns the
    /// entry before (0 for none). Otherwise changes nothing and returns nil.
    mutating func extendVector(with dot: Dot) -> UInt64? {
        if !dotCloud.isEmpty, dotCloud[dot.replica] != nil { return nil }
        let current = versionVector[dot.replica] ?? 0
        guard current < UInt64.max, dot.counter == current + 1 else { return nil }
        versionVector[dot.replica] = dot.counter
        return current
    }

    public func merged(with other: CausalContext) -> CausalContext {
        var copy = self
        copy.merge(other)
        return copy
    }

    /// Whether every dot of `other` is in `self`.
    ///
    /// - Complexity: O(size of `other` + cloud dots here), whatever the counters' magnitudes.
    public func includes(_ other: CausalContext) -> Bool {
        for (replica, counter) in other.versionVector {
            let ours = versionVector[replica] ?? 0
            guard counter > ours else { continue }
            // Every counter of ours+1...counter must be in our cloud. Cloud counters are all
            // above `ours` and distinct, so that holds iff the cloud has `counter - ours` of them
            // up to `counter`. (In canonical form `ours + 1` is never in the cloud, so this is
            // false; counting keeps it exact, and bounded by the cloud, for any form.)
            guard let cloud = dotCloud[replica], UInt64(cloud.count) >= counter - ours else { return false }
            var inRange: UInt64 = 0
            for c in cloud where c <= counter { inRange += 1 }
            if inRange != counter - ours { return false }
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

    /// Why this context breaks a bound of ``ValidationLimits`` (too many replicas or cloud
    /// dots, a counter above ``ValidationLimits/maxCounter``), or nil if it does not.
    ///
    /// - Complexity: O(replicas + cloud dots).
    public var limitViolation: String? {
        let replicaCount = replicaCount
        if replicaCount > ValidationLimits.maxContextReplicas {
            return "context names \(replicaCount) replicas (limit \(ValidationLimits.maxContextReplicas))"
        }
        let cloudDots = cloudDotCount
        if cloudDots > ValidationLimits.maxCloudDots {
            return "context holds \(cloudDots) out-of-order dots (limit \(ValidationLimits.maxCloudDots))"
        }
        for (replica, counter) in versionVector where counter > ValidationLimits.maxCounter {
            return "context counter \(counter) of replica \(replica) exceeds \(ValidationLimits.maxCounter)"
        }
        for (replica, cloud) in dotCloud {
            for counter in cloud where counter > ValidationLimits.maxCounter {
                return "context counter \(counter) of replica \(replica) exceeds \(ValidationLimits.maxCounter)"
            }
        }
        return nil
    }

    /// Sets the entry of a replica not yet present from decoded parts: its contiguous counter
    /// and its cloud counters in strictly ascending order (each above `contiguous`). Cloud
    /// counters that continue the vector move into it, so the result is canonical.
    ///
    /// - Complexity: O(cloud counters).
    mutating func setDecodedEntry(_ replica: ReplicaID, contiguous: UInt64, ascendingCloud cloud: [UInt64]) {
        var top = contiguous
        var first = 0
        while first < cloud.count, top < UInt64.max, cloud[first] == top + 1 {
            top += 1
            first += 1
        }
        if top > 0 { versionVector[replica] = top }
        if first < cloud.count { dotCloud[replica] = Set(cloud[first...]) }
    }

    /// Moves the cloud dots of `replica` that the vector now covers or continues into the
    /// vector. `coveredFrom...vector` is the range the vector just gained; cloud dots in it are
    /// dropped (visiting whichever is smaller, the range or the cloud), then dots that continue
    /// the vector move into it one by one.
    private mutating func compact(_ replica: ReplicaID, coveredFrom start: UInt64) {
        compact(replica, coveredFrom: start) { _, _, _ in }
    }

    @inline(__always)
    private mutating func compact(_ replica: ReplicaID, coveredFrom start: UInt64, cloudChanged: (ReplicaID, UInt64, Bool) -> Void) {
        // Take the set out of the dictionary so it is uniquely referenced and changes in place.
        guard var cloud = dotCloud.removeValue(forKey: replica) else { return }
        var top = versionVector[replica] ?? 0
        if start <= top {
            if top - start < UInt64(cloud.count) {
                for counter in start...top where cloud.remove(counter) != nil { cloudChanged(replica, counter, false) }
            } else {
                for counter in cloud where counter <= top { cloudChanged(replica, counter, false) }
                cloud = cloud.filter { $0 > top }
            }
        }
        while top < UInt64.max, cloud.remove(top + 1) != nil {
            top += 1
            cloudChanged(replica, top, false)
        }
        if top > 0 { versionVector[replica] = top }
        if !cloud.isEmpty { dotCloud[replica] = cloud }
    }
}

/// How two sets of seen events (or the states they describe) relate.
package enum CausalRelation: Sendable, Equatable {
    case equal
    /// The left side saw a strict subset of what the right side saw.
    case happenedBefore
    /// The left side saw a strict superset of what the right side saw.
    case happenedAfter
    /// Each side saw something the other did not.
    case concurrent
}

extension CausalContext: JoinSemilattice {}
