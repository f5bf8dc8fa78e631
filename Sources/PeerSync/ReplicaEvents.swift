@_spi(Engine) import PeerSyncCRDT
import PeerSyncReplication
import PeerSyncNetwork

// What a replica reports to an app: its changes, its sync status and what stops it syncing.

/// A change to a replica's records, wherever it came from (``Replica/changes()``).
public struct ReplicaChange: Sendable, Equatable {
    /// Where a change came from.
    public typealias Origin = ChangeOrigin

    /// Where the change came from.
    public let origin: Origin
    /// The records that changed (a superset of those whose values changed; empty when so much
    /// changed that the replica reloaded — another process's large commit, a purge: re-read
    /// everything).
    public let records: Set<RecordKey>
}

/// The changes of a replica as they are committed (``Replica/changes()``), for `for await`:
/// a sequence that is its own iterator.
///
/// It never drops a change: while the reader is busy, changes accumulate as sets of record
/// IDs per origin (memory grows with the records changed, not with the commits), and the next
/// call to `next()` returns them, one ``ReplicaChange`` per origin. Iterate it once.
public struct ReplicaChanges: AsyncSequence, AsyncIteratorProtocol, Sendable {
    public typealias Element = ReplicaChange
    public typealias Failure = Never
    private let subscription: CommitSubscription
    private var ready: [ReplicaChange] = []

    init(_ subscription: CommitSubscription) { self.subscription = subscription }

    public func makeAsyncIterator() -> ReplicaChanges { self }

    /// Waits for the next change; nil once the iterating task is cancelled.
    public mutating func next() async -> ReplicaChange? {
        // Bounded: each wait returns for a commit (or cancellation), and a commit that
        // changed no record (device-local settings) is skipped.
        while ready.isEmpty {
            guard await subscription.waitForChanges() else { return nil }
            ready = Self.changes(in: subscription.drain())
        }
        return ready.removeFirst()
    }

    /// One change per origin, in a fixed order (local, other processes, peers by replica).
    static func changes(in pending: PendingChanges) -> [ReplicaChange] {
        var changes = pending.reloadedBy.map { ReplicaChange(origin: $0, records: []) }
        for (origin, keys) in pending.byOrigin where !pending.reloadedBy.contains(origin) && !keys.isEmpty {
            changes.append(ReplicaChange(origin: origin, records: keys))
        }
        return changes.sorted { rank($0.origin) < rank($1.origin) }
    }

    private static func rank(_ origin: ChangeOrigin) -> String {
        switch origin {
        case .local: "0"
        case .otherProcess: "1"
        case .peer(let name, let replica): "2\(replica.description)\(name)"
        }
    }
}

/// Where sync stands, for a status line in an app.
public enum SyncStatus: Sendable, Equatable {
    /// Sync is off: the replica works locally only.
    case disabled
    /// Sync is on, no peer connected yet (or all went away).
    case connecting
    /// Exchanging data; `progress` is the catch-up fraction when known.
    case syncing(progress: Double?)
    /// Every connected peer holds the same state as this replica.
    case inSync(lastSync: Date, peers: [String])
    /// Something a person can fix (wrong group, clock skew, port in use, storage).
    case error(SyncIssue)
}

/// What this device knows of its own removal from the group (``Replica/removal``).
public struct RemovalNotice: Sendable, Equatable, CustomStringConvertible {
    /// How this device learned of its removal: signed in its roster, or a peer's word.
    public enum Source: Sendable, Equatable {
        /// This device holds the admin's signed removal entry.
        case roster
        /// A peer refused this device as removed (error reason 13). The removed device is sent
        /// nothing, so it rarely holds the entry itself; this is the peer's word, kept while the
        /// replica is open, until a peer syncs with it to equal digests.
        case peer(address: String)
    }

    /// How this device learned of it.
    public let source: Source
    /// The admin who removed this device (its name, else its short device ID), if known here.
    public let by: String?
    /// When the removal was signed, if known here.
    public let at: Date?
    /// One line: the roster's account (`removed from the group by Ana at …`), or the peer's words.
    public let detail: String

    /// The removal of `device` in `roster`, if it is removed there.
    init?(roster: Roster, device: DeviceID) {
        guard let removal = roster.devices[device]?.removal ?? roster.banned[device],
              let detail = roster.removalText(of: device) else { return nil }
        (source, self.detail) = (.roster, detail)
        by = roster.devices[removal.by]?.name ?? removal.by.shortForm
        at = Date(timeIntervalSince1970: Double(removal.at.physicalMilliseconds) / 1000)
    }

    /// A peer at `address` refused this device as removed, saying `detail`.
    init(peer address: String, detail: String) {
        (source, by, at, self.detail) = (.peer(address: address), nil, nil, detail)
    }

    public var description: String {
        switch source {
        case .roster: "this device was \(detail)"
        case .peer(let address): "this device was removed from the group, says the peer at \(address): \(detail)"
        }
    }
}

/// What stops sync, in terms a person can act on.
public enum SyncIssue: Sendable, Equatable, CustomStringConvertible {
    /// A session to `address` failed or was refused, and no peer is connected.
    case session(address: String, reason: SessionEndReason)
    /// The local store cannot be read.
    case storage(String)
    /// This device was removed from the group by an admin: it can no longer sync.
    case removedFromGroup(RemovalNotice)

    public var description: String {
        switch self {
        case .session(let address, let reason): "\(address): \(reason)"
        case .storage(let detail): "storage: \(detail)"
        case .removedFromGroup(let notice): "\(notice)"
        }
    }
}
