/// A state-based CRDT: a value type whose states form a join-semilattice.
///
/// Implementers must keep these laws, for all states `a`, `b`, `c` (the shared law checker in
/// `PeerSyncTestSupport` runs them on every conforming type):
/// - commutative: `a.merged(with: b) == b.merged(with: a)`
/// - associative: `a.merged(with: b).merged(with: c) == a.merged(with: b.merged(with: c))`
/// - idempotent: `a.merged(with: a) == a`
///
/// CRDTs must have value semantics: `merge` changes only `self`.
/// See Shapiro et al., "Conflict-free Replicated Data Types" (2011).
package protocol JoinSemilattice: Equatable {
    /// Joins `other` into `self`.
    mutating func merge(_ other: Self)
}

extension JoinSemilattice {
    /// The join of `self` and `other`.
    public func merged(with other: Self) -> Self {
        var copy = self
        copy.merge(other)
        return copy
    }
}

/// A delta-state CRDT (Almeida, Shoker, Baquero, "Delta State Replicated Data Types", 2018):
/// its mutators return a small state of the same type (a delta) that was already joined into
/// `self`; joining the delta into any other replica has the effect of the mutation there.
///
/// Besides the join laws: for a mutation `m` returning `d` from state `x`, `x ⊔ d == m(x)`.
package protocol DeltaCRDT: JoinSemilattice {
    /// The dots this state has seen.
    var context: CausalContext { get }
}

/// A delta CRDT that can compute what a peer lacks from the peer's causal context alone
/// (anti-entropy). Law: for reachable states `a`, `b`:
/// `b.merged(with: a.delta(missingFrom: b.context)) == b.merged(with: a)`.
package protocol AntiEntropyCRDT: DeltaCRDT {
    /// The part of `self` a replica whose context is `peer` lacks. For an empty context this is
    /// the full state.
    func delta(missingFrom peer: CausalContext) -> Self
}
