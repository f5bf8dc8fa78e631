/// What one member of the group (a device of the roster) has seen, as compaction needs it.
package struct MemberView: Sendable, Hashable {
    /// The causal context the member last reported (its latest incarnation's); empty if it has
    /// reported nothing yet.
    public var seen: CausalContext
    /// Every replica ID the member writes or wrote as (all its incarnations).
    public var ownReplicas: Set<ReplicaID>

    public init(seen: CausalContext, ownReplicas: Set<ReplicaID>) {
        self.seen = seen
        self.ownReplicas = ownReplicas
    }
}

extension CausalContext {
    /// The dots in both `self` and `other` (set intersection, the meet of the lattice).
    ///
    /// - Complexity: O(replicas + cloud dots of both).
    public func intersection(_ other: CausalContext) -> CausalContext {
        var result = CausalContext()
        for replica in replicas where other.maxCounter(of: replica) > 0 {
            let mine = contiguousCounter(of: replica)
            let theirs = other.contiguousCounter(of: replica)
            let base = min(mine, theirs)
            var cloud: [UInt64] = []
            // Above `base`, one side's dots are exactly its cloud dots: the lower side's cloud
            // holds every candidate, each kept if the other side has it too.
            let (lower, higher) = mine <= theirs ? (self, other) : (other, self)
            lower.forEachEntry(of: replica) { counter, inCloud in
                if inCloud, counter > base, higher.contains(Dot(replica: replica, counter: counter)) { cloud.append(counter) }
            }
            cloud.sort()
            result.setDecodedEntry(replica, contiguous: base, ascendingCloud: cloud)
        }
        return result
    }

    /// The dots every one of `contexts` holds; empty for no contexts.
    public static func meet(of contexts: some Sequence<CausalContext>) -> CausalContext {
        var iterator = contexts.makeIterator()
        guard var result = iterator.next() else { return CausalContext() }
        while let next = iterator.next(), !result.isEmpty { result = result.intersection(next) }
        return result
    }

    /// The dots of `self` made by one of `writers`.
    public func restricted(to writers: Set<ReplicaID>) -> CausalContext {
        var result = CausalContext()
        for replica in writers {
            var cloud: [UInt64] = []
            var contiguous: UInt64 = 0
            forEachEntry(of: replica) { counter, inCloud in
                if inCloud { cloud.append(counter) } else { contiguous = counter }
            }
            if contiguous == 0 && cloud.isEmpty { continue }
            cloud.sort()
            result.setDecodedEntry(replica, contiguous: contiguous, ascendingCloud: cloud)
        }
        return result
    }
}

/// The part of history that is *stable*: dots every current member has seen, with no write
/// concurrent with them still on its way to anyone. Deleted records whose dots are all stable
/// can be purged (``RecordMap/purge(stable:limit:)``).
///
/// Two rounds (docs/PROTOCOL.md §19.2): a candidate is the
/// meet `S` of the members' seen contexts together with the writers' frontier `F` (each
/// member's own writes that it had made by the time it reported); once a later meet includes
/// `F`, `S` joins ``stable``. A write concurrent with a dot of `S` was made by a member before
/// it saw that dot, so it is in `F` — and by then in every member's context.
///
/// ``stable`` only grows, and the union of two frontiers' stable contexts is stable (each is
/// below every member's context), so ``merge(_:)`` is a join: peers can pass it on.
package struct CompactionFrontier: Sendable, Hashable {
    /// A meet waiting for the writers' frontier to be seen by everyone.
    package struct Candidate: Sendable, Hashable {
        /// The members when it was taken (it is dropped if they change).
        public var members: Set<ReplicaID>
        /// The meet of their seen contexts then.
        public var meet: CausalContext
        /// Their own writes then.
        public var writers: CausalContext

        public init(members: Set<ReplicaID>, meet: CausalContext, writers: CausalContext) {
            self.members = members
            self.meet = meet
            self.writers = writers
        }
    }

    /// Dots that are stable: grow-only.
    public private(set) var stable: CausalContext
    /// The next meet to become stable, if one is waiting.
    public private(set) var candidate: Candidate?

    public init(stable: CausalContext = CausalContext(), candidate: Candidate? = nil) {
        self.stable = stable
        self.candidate = candidate
    }

    /// Takes the members' current views (keyed by their latest replica ID; the local device
    /// included, with its own context). Promotes the candidate if the meet now includes its
    /// writers' frontier, and takes a new candidate when none waits. Returns whether
    /// ``stable`` grew.
    ///
    /// A member missing from `members` is not a member (a removed device); a member with an
    /// empty `seen` holds everything back.
    ///
    /// - Complexity: O(members × (replicas + cloud dots)).
    /// `departed`: writes of removed members that some member may still pass on (the removal
    /// cutoffs, as far as this replica knows them). They join the writers' frontier, since a
    /// removed device no longer reports the writes it made before seeing a delete.
    @discardableResult
    public mutating func advance(members: [ReplicaID: MemberView], departed: CausalContext = CausalContext()) -> Bool {
        guard !members.isEmpty else { return false }
        let memberIDs = Set(members.keys)
        let meet = CausalContext.meet(of: members.values.map(\.seen))
        var grew = false
        if let waiting = candidate, waiting.members != memberIDs {
            candidate = nil  // a member came or went: its writes may never reach everyone
        }
        if let waiting = candidate, meet.includes(waiting.writers) {
            if !stable.includes(waiting.meet) {
                stable.merge(waiting.meet)
                grew = true
            }
            candidate = nil
        }
        if candidate == nil, !stable.includes(meet) {
            var writers = departed
            for view in members.values { writers.merge(view.seen.restricted(to: view.ownReplicas)) }
            candidate = Candidate(members: memberIDs, meet: meet, writers: writers)
        }
        return grew
    }

    /// Joins a frontier another replica computed: its stable dots are stable here too. The
    /// candidate stays this replica's own.
    public mutating func merge(_ other: CompactionFrontier) {
        stable.merge(other.stable)
    }

    /// The members (of `members`) that hold back the dots in `needed`: those whose seen
    /// context does not include them. If every member has seen them, the second round waits
    /// for the members' own writes to reach everyone: then the members that have not seen all
    /// of those. Sorted by ID.
    public static func holdingBack(_ needed: CausalContext, members: [ReplicaID: MemberView]) -> [ReplicaID] {
        if needed.isEmpty { return [] }
        let lacking = members.filter { !$0.value.seen.includes(needed) }.keys.sorted()
        if !lacking.isEmpty { return lacking }
        var writers = CausalContext()
        for view in members.values { writers.merge(view.seen.restricted(to: view.ownReplicas)) }
        return members.filter { !$0.value.seen.includes(writers) }.keys.sorted()
    }
}
