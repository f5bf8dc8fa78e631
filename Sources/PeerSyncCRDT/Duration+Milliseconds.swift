/// The one conversion between `Duration` and whole milliseconds used across PeerSync (wire
/// fields, status files, timeouts handed to C APIs).
extension Duration {
    /// Whole milliseconds, rounded toward zero; negative durations give negative values.
    /// Saturates at `Int64.min`/`Int64.max` instead of trapping.
    public var wholeMilliseconds: Int64 {
        let (seconds, attoseconds) = components
        let (fromSeconds, overflow) = seconds.multipliedReportingOverflow(by: 1_000)
        if overflow { return seconds < 0 ? .min : .max }
        let (total, overflow2) = fromSeconds.addingReportingOverflow(attoseconds / 1_000_000_000_000_000)
        if overflow2 { return seconds < 0 ? .min : .max }
        return total
    }

    /// Whole milliseconds, rounded up, clamped to `0...Int32.max` (for `poll()` and similar C timeouts).
    public var clampedMillisecondsRoundingUp: Int32 {
        let (seconds, attoseconds) = components
        if seconds < 0 || (seconds == 0 && attoseconds <= 0) { return 0 }
        if seconds >= Int64(Int32.max) / 1_000 { return .max }
        let ms = seconds * 1_000 + (attoseconds + 999_999_999_999_999) / 1_000_000_000_000_000
        return Int32(min(ms, Int64(Int32.max)))
    }

    /// Milliseconds as a `Double` (for reports and benchmarks).
    public var millisecondsDouble: Double {
        Double(components.seconds) * 1_000 + Double(components.attoseconds) / 1e15
    }
}
