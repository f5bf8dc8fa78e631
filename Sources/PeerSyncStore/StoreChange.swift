@_spi(Engine) import PeerSyncCRDT
/// A change another process committed (or this one, for the journal reader).
package struct StoreChange: Sendable {
    /// The journal's sequence number.
    public let sequence: Int64
    /// "local", or the peer it came from, or "reload".
    public let origin: String
    /// The delta that was committed; nil if the state was reloaded whole (ship a full
    /// anti-entropy round to peers then).
    public let delta: RecordMap?
}

/// One committed transaction as the journal keeps it.
package struct JournalEntry: Sendable {
    public let sequence: Int64
    /// Wall-clock milliseconds since 1970 at commit.
    public let committedAt: Int64
    public let origin: String
    public let summary: String
    /// nil for very large catch-ups, which are not kept.
    public let delta: RecordMap?
}
