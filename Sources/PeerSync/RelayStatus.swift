import Foundation

/// One relay as this device sees it (``Replica/relayStatus()``, `peersync status`).
public struct RelayStatus: Sendable, Equatable {
    /// Where the device dials it.
    public var address: String
    /// The relay's device ID (short form) once a session reached it.
    public var relay: String?
    /// A session is up and the relay has answered what this device lacks.
    public var connected = false
    /// When the relay last confirmed an upload as stored.
    public var lastUpload: Date?
    /// Counters this device holds that the relay has not confirmed yet (all writers).
    public var pending: UInt64 = 0
    /// What the relay shows it holds but has not delivered within the bound, one line each
    /// ("writer W's counters n–m"); a direct session with that writer heals it.
    public var withheld: [String] = []
    /// Blobs from this relay refused (altered, replayed, re-attributed, undecryptable), with
    /// the last reason.
    public var refusedBlobs = 0
    /// The last error or refusal, if the session is not up.
    public var lastError: String?
}
