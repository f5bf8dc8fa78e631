/// A hybrid logical clock timestamp (Kulkarni et al., "Logical Physical Clocks", 2014):
/// 48 bits of wall-clock milliseconds since 1970 and a 16-bit logical counter, in one `UInt64`
/// that orders like the pair.
///
/// ```
///  63                                  16 15            0
/// +--------------------------------------+---------------+
/// |      physical time (ms since 1970)   |    logical    |
/// +--------------------------------------+---------------+
/// ```
public struct HLCTimestamp: RawRepresentable, Hashable, Comparable, Sendable, CustomStringConvertible {
    public let rawValue: UInt64

    public init(rawValue: UInt64) { self.rawValue = rawValue }

    public init(physicalMilliseconds: UInt64, logical: UInt16) {
        precondition(physicalMilliseconds < (1 << 48), "physical time exceeds 48 bits")
        rawValue = physicalMilliseconds << 16 | UInt64(logical)
    }

    /// The lowest timestamp; older than every write.
    public static let zero = HLCTimestamp(rawValue: 0)

    public var physicalMilliseconds: UInt64 { rawValue >> 16 }
    public var logical: UInt16 { UInt16(truncatingIfNeeded: rawValue) }

    public static func < (lhs: HLCTimestamp, rhs: HLCTimestamp) -> Bool { lhs.rawValue < rhs.rawValue }

    public var description: String { "\(physicalMilliseconds).\(logical)" }
}

/// `max` is a join: the timestamps a replica has observed form a semilattice.
extension HLCTimestamp: JoinSemilattice {
    public mutating func merge(_ other: HLCTimestamp) {
        if other > self { self = other }
    }
}

/// A hybrid logical clock: timestamps that follow wall-clock time when clocks agree and still
/// order causally when they do not. A write made after observing timestamp `t` gets a
/// timestamp greater than `t`, even if the local wall clock is behind.
///
/// The physical clock is injectable so tests can skew and freeze time.
@usableFromInline
package struct HybridLogicalClock: Sendable {
    /// Milliseconds since 1970.
    @usableFromInline
    package typealias PhysicalClock = @Sendable () -> UInt64

    /// The largest timestamp issued or observed.
    public private(set) var latest: HLCTimestamp
    private let physicalClock: PhysicalClock

    public init(latest: HLCTimestamp = .zero, physicalClock: @escaping PhysicalClock = HybridLogicalClock.wallClock) {
        self.latest = latest
        self.physicalClock = physicalClock
    }

    /// The system's wall clock in milliseconds since 1970 (0 before 1970, and at most
    /// ``ValidationLimits/maxPhysicalMilliseconds``).
    @usableFromInline
    package static let wallClock: PhysicalClock = {
        let milliseconds = Date().timeIntervalSince1970 * 1000
        guard milliseconds > 0 else { return 0 }  // also NaN
        return UInt64(min(milliseconds, Double(ValidationLimits.maxPhysicalMilliseconds)))
    }

    /// The current reading of this clock's physical source.
    public var physicalNow: UInt64 { physicalClock() }

    /// A new timestamp for a local event, greater than every timestamp issued or observed.
    ///
    /// If the logical counter would overflow, the physical part moves one millisecond ahead.
    /// Timestamps never pass ``ValidationLimits/maxTimestamp`` (the year 9999): a clock that
    /// has reached it (only a wall clock or a peer's timestamp from that year can bring it
    /// there) returns it again rather than issue a timestamp every peer would refuse.
    public mutating func tick() -> HLCTimestamp {
        let now = min(physicalClock(), ValidationLimits.maxPhysicalMilliseconds)
        if now > latest.physicalMilliseconds {
            latest = HLCTimestamp(physicalMilliseconds: now, logical: 0)
        } else if latest.rawValue >= ValidationLimits.maxTimestamp.rawValue {
            latest = ValidationLimits.maxTimestamp
        } else if latest.logical == .max {
            latest = HLCTimestamp(physicalMilliseconds: latest.physicalMilliseconds + 1, logical: 0)
        } else {
            latest = HLCTimestamp(rawValue: latest.rawValue + 1)
        }
        return latest
    }

    /// Takes note of a timestamp received from another replica, so that the next ``tick()``
    /// is greater than it.
    public mutating func observe(_ remote: HLCTimestamp) {
        latest.merge(remote)
    }
}
