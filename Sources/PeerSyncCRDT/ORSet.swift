/// An add-wins observed-remove set without tombstones: the "optimized OR-Set" of Bieniusa et
/// al. (2012) in its delta-state form (Almeida et al., 2018).
///
/// Each element maps to the dots of the adds that are still live; the causal context records
/// every dot seen. Removing an element drops the dots this replica observed for it, so an add
/// made concurrently (a dot the remover never saw) survives: add wins. A removed element leaves
/// nothing behind but its dots in the context, which compact into the version vector, so the
/// metadata stays proportional to live elements + replicas however many add/remove cycles run.
///
/// Mutators return the delta they applied; ship it to peers and `merge` it there.
package struct ORSet<Element: Hashable & Sendable>: Sendable {
    /// element → dots of its live adds (never empty).
    public private(set) var entries: [Element: Set<Dot>]
    public private(set) var context: CausalContext

    public init() {
        entries = [:]
        context = CausalContext()
    }

    init(entries: [Element: Set<Dot>], context: CausalContext) {
        self.entries = entries
        self.context = context
    }

    public var elements: Set<Element> { Set(entries.keys) }
    public var count: Int { entries.count }
    public func contains(_ element: Element) -> Bool { entries[element] != nil }

    /// Dots held for live elements (not counting the context).
    public var liveDotCount: Int { entries.values.reduce(0) { $0 + $1.count } }

    /// Adds `element` as `replica`. The delta also covers the element's earlier dots, so one
    /// live dot per element remains on this replica.
    ///
    /// - Throws: ``CounterExhaustedError`` (and changes nothing) if `replica` has no counter left.
    @discardableResult
    public mutating func insert(_ element: Element, by replica: ReplicaID) throws(CounterExhaustedError) -> ORSet {
        let dot = try context.nextDot(for: replica)
        var deltaContext = CausalContext(dots: entries[element] ?? [])
        deltaContext.insert(dot)
        let delta = ORSet(entries: [element: [dot]], context: deltaContext)
        merge(delta)
        return delta
    }

    /// Removes `element` as far as this replica has observed it. Returns nil if absent.
    @discardableResult
    public mutating func remove(_ element: Element) -> ORSet? {
        guard let dots = entries[element] else { return nil }
        let delta = ORSet(entries: [:], context: CausalContext(dots: dots))
        merge(delta)
        return delta
    }
}

extension ORSet: DeltaCRDT {
    /// Keeps a dot if both sides have it, or if one side has it and the other never saw it.
    public mutating func merge(_ other: ORSet) {
        var result: [Element: Set<Dot>] = [:]
        result.reserveCapacity(max(entries.count, other.entries.count))
        for (element, dots) in entries {
            let theirs = other.entries[element] ?? []
            let kept = dots.filter { theirs.contains($0) || !other.context.contains($0) }
            if !kept.isEmpty { result[element] = kept }
        }
        for (element, dots) in other.entries {
            let ours = entries[element] ?? []
            let added = dots.filter { !ours.contains($0) && !context.contains($0) }
            if !added.isEmpty { result[element, default: []].formUnion(added) }
        }
        entries = result
        context.merge(other.context)
    }
}

extension ORSet: Equatable {}
