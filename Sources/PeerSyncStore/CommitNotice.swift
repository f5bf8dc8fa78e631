@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel

/// What one state change of a ``ReplicaStore`` touched, as observers see it: a local commit, a
/// remote delta joined, or other processes' commits joined by ``ReplicaStore/refresh()``.
package struct CommitNotice: Sendable {
    /// Numbers every state change of this store object, from 1, in commit order.
    public let sequence: UInt64
    /// The records the change wrote (a superset of those whose values or visibility changed).
    public let keys: Set<RecordKey>
    /// The whole state may have changed (another process committed more than the journal
    /// keeps): re-read everything. `keys` is empty then.
    public let reload: Bool
    /// Device-local settings changed.
    public let localSettingsChanged: Bool
    /// The conflict log changed (new entries, or one marked resolved).
    public let conflictsChanged: Bool
    /// `keys` by where they came from (one entry, sharing `keys`' storage, for most changes).
    public let origins: [ChangeOrigin: Set<RecordKey>]
    /// With `reload`: whose change made everyone re-read.
    public let reloadOrigin: ChangeOrigin?
    /// The deltas sync must ship: every delta of the change that did not come from a peer
    /// (this process's writes and imports, other processes' commits). See ``CommitInterest/outgoing``.
    public let outgoing: [RecordMap]
    /// Another process rewrote more than its journal keeps: sync must offer peers everything.
    public let resync: Bool
    /// Attachment bytes arrived, were completed, added or deleted (no state change).
    public var attachmentsChanged = false
}

/// Which changes a ``CommitSubscription`` wants to hear about.
package struct CommitInterest: Sendable {
    /// Collections whose records matter; nil means all of them.
    public var collections: Set<String>?
    /// Wake up for changes to device-local settings.
    public var localSettings: Bool
    /// Wake up for changes to the conflict log.
    public var conflicts: Bool
    /// Keep changed keys by origin (``PendingChanges/byOrigin``).
    public var origins: Bool
    /// Keep the deltas to ship, joined (``PendingChanges/outgoing``): the replicator's interest.
    public var outgoing: Bool
    /// Wake up when attachment bytes arrive, complete, are added or deleted.
    public var attachments: Bool

    /// An interest in `collections` (nil: all) and, optionally, local settings, conflicts,
    /// keys by origin, the deltas to ship and attachment files.
    public init(collections: Set<String>?, localSettings: Bool = false, conflicts: Bool = false,
                origins: Bool = false, outgoing: Bool = false, attachments: Bool = false) {
        self.collections = collections
        self.localSettings = localSettings
        self.conflicts = conflicts
        self.origins = origins
        self.outgoing = outgoing
        self.attachments = attachments
    }

    func wants(_ key: RecordKey) -> Bool { collections?.contains(key.collection) ?? true }

    /// Whether changed keys matter at all (the replicator's interest, `collections: []` and
    /// `outgoing`, wants only the deltas to ship: naming every key of a 100k-record catch-up
    /// for it cost a sixth of the initial sync, issue 30).
    var wantsKeys: Bool { origins || collections.map { !$0.isEmpty } ?? true }
}

/// The changes a subscription has accumulated since it was last drained (several commits
/// coalesced into one set).
package struct PendingChanges: Sendable {
    /// Changed records of interest.
    public var keys: Set<RecordKey> = []
    /// Re-read everything of interest.
    public var reload = false
    /// Device-local settings changed.
    public var localSettingsChanged = false
    /// The conflict log changed.
    public var conflictsChanged = false
    /// With ``CommitInterest/attachments``: attachment files changed.
    public var attachmentsChanged = false
    /// Sequence number of the newest commit included; 0 if none.
    public var newestSequence: UInt64 = 0
    /// With ``CommitInterest/origins``: changed keys of interest by origin.
    public var byOrigin: [ChangeOrigin: Set<RecordKey>] = [:]
    /// With ``CommitInterest/origins``: origins whose change made everything to be re-read.
    public var reloadedBy: Set<ChangeOrigin> = []
    /// With ``CommitInterest/outgoing``: the deltas to ship, joined into one (a join of deltas
    /// is a delta: shipping it once is shipping each).
    public var outgoing: RecordMap?
    /// With ``CommitInterest/outgoing``: peers must be offered everything (another process's
    /// change too large for its journal).
    public var resync = false

    /// Nothing pending.
    public init() {}

    /// Whether nothing of interest changed.
    public var isEmpty: Bool {
        keys.isEmpty && !reload && !localSettingsChanged && !conflictsChanged && !attachmentsChanged && outgoing == nil && !resync
    }

    mutating func absorb(_ notice: CommitNotice, _ interest: CommitInterest) {
        newestSequence = max(newestSequence, notice.sequence)
        if notice.reload { reload = true }
        if interest.localSettings && notice.localSettingsChanged { localSettingsChanged = true }
        if interest.conflicts && notice.conflictsChanged { conflictsChanged = true }
        if interest.attachments && notice.attachmentsChanged { attachmentsChanged = true }
        if interest.outgoing {
            for delta in notice.outgoing {
                if outgoing == nil { outgoing = delta } else { outgoing!.merge(delta) }
            }
            if notice.resync { resync = true }
        }
        if interest.origins {
            if let origin = notice.reloadOrigin { reloadedBy.insert(origin) }
            for (origin, keys) in notice.origins {
                let wanted = interest.collections == nil ? keys : keys.filter(interest.wants)
                guard !wanted.isEmpty else { continue }
                if byOrigin[origin] == nil { byOrigin[origin] = wanted } else { byOrigin[origin]!.formUnion(wanted) }
            }
        }
        guard !reload else {
            keys = []
            return
        }
        if interest.collections == nil {
            keys.formUnion(notice.keys)
        } else if interest.wantsKeys {
            for key in notice.keys where interest.wants(key) { keys.insert(key) }
        }
    }

    /// Joins changes drained earlier (to be looked at again).
    public mutating func absorb(_ other: PendingChanges) {
        newestSequence = max(newestSequence, other.newestSequence)
        byOrigin.merge(other.byOrigin) { $0.union($1) }
        reloadedBy.formUnion(other.reloadedBy)
        if let delta = other.outgoing {
            if outgoing == nil { outgoing = delta } else { outgoing!.merge(delta) }
        }
        resync = resync || other.resync
        reload = reload || other.reload
        localSettingsChanged = localSettingsChanged || other.localSettingsChanged
        conflictsChanged = conflictsChanged || other.conflictsChanged
        attachmentsChanged = attachmentsChanged || other.attachmentsChanged
        if reload { keys = [] } else { keys.formUnion(other.keys) }
    }
}
