/// The order of last-writer-wins: hybrid timestamp first, then the writing replica.
package struct WriteStamp: Hashable, Comparable, Sendable, CustomStringConvertible {
    public let time: HLCTimestamp
    public let replica: ReplicaID

    public init(time: HLCTimestamp, replica: ReplicaID) {
        self.time = time
        self.replica = replica
    }

    public static func < (lhs: WriteStamp, rhs: WriteStamp) -> Bool {
        (lhs.time, lhs.replica) < (rhs.time, rhs.replica)
    }

    public var description: String { "\(time)@\(replica.shortDescription)" }
}

/// A last-writer-wins register: a value and the stamp of the write that set it.
///
/// The join keeps the value with the larger ``WriteStamp``. Each stamp belongs to one write,
/// so two registers with equal stamps hold equal values; should that invariant be broken,
/// the join still picks deterministically (by `Value`'s order) so replicas cannot diverge.
package struct LWWRegister<Value: Comparable & Sendable>: Sendable {
    public private(set) var value: Value
    public private(set) var stamp: WriteStamp

    public init(value: Value, stamp: WriteStamp) {
        self.value = value
        self.stamp = stamp
    }

    /// Sets `value` with a stamp from `clock`; returns the delta (the register itself).
    @discardableResult
    public mutating func assign(_ value: Value, clock: inout HybridLogicalClock, replica: ReplicaID) -> LWWRegister {
        self = LWWRegister(value: value, stamp: WriteStamp(time: clock.tick(), replica: replica))
        return self
    }
}

extension LWWRegister: JoinSemilattice {
    public mutating func merge(_ other: LWWRegister) {
        if other.stamp > stamp || (other.stamp == stamp && other.value > value) {
            self = other
        }
    }
}

extension LWWRegister: Equatable where Value: Equatable {}
extension LWWRegister: Hashable where Value: Hashable {}
