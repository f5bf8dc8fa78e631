/// The bounds on every number and size that reaches a replica from outside its process — a
/// peer's frame, a store file, an import — in one place.
///
/// A value beyond a bound is *malformed* wherever it appears: the wire decoders, the store's
/// blob decoders and the JSON import refuse it with an error naming it, and apply nothing.
/// In return, every operation of ``CausalContext``, ``RecordMap`` and ``HybridLogicalClock``
/// is safe on every value within the bounds: no arithmetic overflows, and the cost of each
/// operation grows with the size of its input, never with the magnitude of a number in it.
///
/// | limit | value | why |
/// |---|---|---|
/// | ``maxCounter`` | 2⁵³ | a million writes a second for 285 years; exact in a JSON number |
/// | ``maxContextReplicas`` | 10,000 | lifetime count of writing devices in one group |
/// | ``maxCloudDots`` | 100,000 | out-of-order dots waiting for their gaps to fill |
/// | ``maxPhysicalMilliseconds`` | 9999-12-31T23:59:59.999Z | keeps the clock far from its 48-bit end |
/// | ``maxValueDepth`` | 64 | nesting of lists and maps in one field value |
///
/// Strings, byte strings, lists and maps have no limit of their own: each is bounded by the
/// bytes left in its frame (4 MiB on the wire), and every count is checked against those
/// bytes before anything is allocated.
package enum ValidationLimits {
    /// The largest event counter (the counter of a ``Dot``): 2⁵³ = 9,007,199,254,740,992.
    ///
    /// A replica making a million writes a second would need 285 years to use them up, and
    /// every valid counter is exact as a JSON/JavaScript number. Bounding counters far below
    /// 2⁶⁴ is what makes the context's arithmetic (`counter + 1`, gaps, ranges) overflow-free.
    /// A replica whose counter has reached the bound (only a hostile peer can bring that about)
    /// refuses further local changes with ``CounterExhaustedError`` instead of trapping.
    public static let maxCounter: UInt64 = 1 << 53

    /// The most replica IDs one causal context may name: 10,000.
    ///
    /// Contexts are never garbage-collected: every replica that ever wrote keeps its entry, so
    /// this bounds the number of writing devices over a group's lifetime (e.g. 200 devices each
    /// reinstalled every month for four years). A context that large is at most ~270 KB in every
    /// hello and ack (under 7 % of a 4 MiB frame) and is merged, compared and hashed in a few
    /// milliseconds. A remote change that would take the local context past the limit is
    /// refused, so a replica never holds a context its peers would refuse.
    public static let maxContextReplicas = 10_000

    /// The most out-of-order ("cloud") dots one causal context may hold, over all its replicas:
    /// 100,000.
    ///
    /// The cloud holds only dots that arrived before earlier dots of the same replica; they
    /// move into the version vector as the gaps fill, so an honest replica holds a handful
    /// (deltas in flight). The bound caps the memory and time a hostile context can cost.
    public static let maxCloudDots = 100_000

    /// The latest physical time a hybrid logical clock timestamp may carry:
    /// 9999-12-31T23:59:59.999Z, in milliseconds since 1970.
    ///
    /// The timestamp format has 48 bits (until the year 10889); staying below year 10000 leaves
    /// the clock 2.8 × 10¹³ ms of headroom, so ``HybridLogicalClock/tick()`` can always move
    /// past any valid timestamp it has observed.
    public static let maxPhysicalMilliseconds: UInt64 = 253_402_300_799_999

    /// The largest valid timestamp: ``maxPhysicalMilliseconds`` with the largest logical part.
    public static let maxTimestamp = HLCTimestamp(rawValue: maxPhysicalMilliseconds << 16 | 0xFFFF)

    /// The deepest nesting of lists and maps in one ``FieldValue``: 64 levels.
    public static let maxValueDepth = 64

    /// Whether `counter` is a valid event counter (1 through ``maxCounter``).
    @inlinable
    public static func isValidCounter(_ counter: UInt64) -> Bool {
        counter >= 1 && counter <= maxCounter
    }

    /// Whether `timestamp` is at most ``maxTimestamp``.
    @inlinable
    public static func isValidTimestamp(_ timestamp: HLCTimestamp) -> Bool {
        timestamp.rawValue <= maxTimestamp.rawValue
    }
}

/// A replica's event counter reached ``ValidationLimits/maxCounter``: it cannot make another
/// change (a write would need a counter above the bound, which every peer refuses).
///
/// Honest replicas never get there (it takes 2⁵³ changes); a peer that sent a dot of this
/// replica with the largest counter did. The replica's data is intact and keeps syncing; to
/// edit again, create a new replica (a new replica ID) and sync it from a peer.
package struct CounterExhaustedError: Error, Equatable, Sendable, CustomStringConvertible {
    /// The replica that cannot take another dot.
    public let replica: ReplicaID

    public init(replica: ReplicaID) {
        self.replica = replica
    }

    public var description: String {
        "replica \(replica) has used its last event counter (\(ValidationLimits.maxCounter)), "
            + "so it cannot make another change; its data is intact — create a new replica and sync it from a peer to edit again"
    }
}

/// Why a value built in memory breaks a bound of ``ValidationLimits`` (values decoded from
/// bytes are refused with a ``BinaryDecodingError`` instead).
package struct LimitViolationError: Error, Equatable, Sendable, CustomStringConvertible {
    public let description: String

    public init(_ description: String) {
        self.description = description
    }
}

// MARK: - Checking values built in memory

extension FieldRegister {
    /// Why this register breaks a bound of ``ValidationLimits`` or an invariant of the encoding
    /// (`supersedes` older than `timestamp`), or nil if it does not.
    public var limitViolation: String? {
        if !ValidationLimits.isValidCounter(dot.counter) {
            return "counter \(dot.counter) outside 1...\(ValidationLimits.maxCounter)"
        }
        if !ValidationLimits.isValidTimestamp(timestamp) { return "timestamp \(timestamp) after the year 9999" }
        if supersedes != .zero && supersedes >= timestamp { return "supersedes \(supersedes), not older than its timestamp \(timestamp)" }
        if value.isNested(deeperThan: ValidationLimits.maxValueDepth - 1) {
            return "value nests deeper than \(ValidationLimits.maxValueDepth) levels"
        }
        return nil
    }
}

extension RecordState {
    /// Why this record breaks a bound of ``ValidationLimits``, or nil if it does not.
    ///
    /// - Complexity: O(size).
    public var limitViolation: String? {
        for (name, register) in fields {
            if let violation = register.limitViolation { return "field \(name): \(violation)" }
        }
        for (replica, entry) in presence {
            if !ValidationLimits.isValidCounter(entry.counter) {
                return "presence counter \(entry.counter) of replica \(replica) outside 1...\(ValidationLimits.maxCounter)"
            }
            if let remover = entry.removedBy, !ValidationLimits.isValidCounter(remover.counter) {
                return "remover counter \(remover.counter) outside 1...\(ValidationLimits.maxCounter)"
            }
        }
        return nil
    }
}

extension RecordMap {
    /// Why this state (or delta) breaks a bound of ``ValidationLimits``, or nil if it does not.
    /// Everything decoded from bytes passes; the store checks every change built in memory
    /// before it writes it, so it never holds what it could not read back or peers would refuse.
    ///
    /// - Complexity: O(size).
    public var limitViolation: String? {
        if let violation = context.limitViolation { return violation }
        for (collection, records) in collections {
            for (id, state) in records {
                if let violation = state.limitViolation { return "record \(collection)/\(id.uuidString): \(violation)" }
            }
        }
        return nil
    }
}
