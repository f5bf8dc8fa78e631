/// One event of one replica: the replica's ID and its counter for that event.
///
/// Every local mutation takes the next counter of its replica, so a replica's dots are
/// 1, 2, 3, … without gaps. A ``CausalContext`` records which dots a replica has seen.
package struct Dot: Hashable, Comparable, Sendable, CustomStringConvertible {
    public let replica: ReplicaID
    public let counter: UInt64

    public init(replica: ReplicaID, counter: UInt64) {
        self.replica = replica
        self.counter = counter
    }

    public static func < (lhs: Dot, rhs: Dot) -> Bool {
        (lhs.replica, lhs.counter) < (rhs.replica, rhs.counter)
    }

    public var description: String { "\(replica.shortDescription):\(counter)" }
}
