import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncStore

/// One concurrent overwrite, ready for a message like "Anna's change to the title was replaced
/// by Ben's": which record and field, both values with who wrote them and when, and whether
/// the app marked it resolved.
public struct ReplicaConflict: Identifiable, Hashable, Sendable {
    /// One side of a conflict: a value and its write.
    public struct Write: Hashable, Sendable {
        /// The value written.
        public let value: FieldValue
        /// The replica that wrote it.
        public let writer: ReplicaID
        /// That replica's name, if this replica knows it (its own name, names of peers it has
        /// received changes from, or names given with ``Replica/setPeerName(_:for:)``).
        public let writerName: String?
        /// The write's hybrid timestamp (decides who wins: the later one).
        public let timestamp: HLCTimestamp

        /// The write's wall-clock time (the timestamp's physical part).
        public var writtenAt: Date { Date(hybridTimestamp: timestamp) }

        /// The value as the record type's property holds it: for a conflict on `Shift.note`,
        /// `try conflict.loser.value(as: String.self)` (dates, enums, references and nested
        /// `Codable` values decode as they do in a record). Throws
        /// ``ReplicaError/invalidRecord(_:)`` if the value is not of that type.
        public func value<T: Decodable>(as type: T.Type) throws(ReplicaError) -> T {
            try ReplicaError.wrapping(otherwise: ReplicaError.invalidRecord) {
                try FieldDecoder().decode(T.self, from: value)
            }
        }
    }

    /// Stable and unique in this replica's store; pass it to ``Replica/resolveConflict(_:)``.
    public let id: Int64
    /// The record whose field was overwritten.
    public let record: RecordKey
    /// The field's name (a property of the record type).
    public let field: String
    /// The value the record has now.
    public let winner: Write
    /// The value that was replaced (or rejected).
    public let loser: Write
    /// When this replica noticed the conflict.
    public let detectedAt: Date
    /// Whether the app marked it resolved.
    public let isResolved: Bool
}

extension Date {
    /// The wall-clock instant of a hybrid timestamp.
    init(hybridTimestamp: HLCTimestamp) {
        self.init(timeIntervalSince1970: Double(hybridTimestamp.physicalMilliseconds) / 1000)
    }
}

extension Replica {
    /// The newest conflicts (up to 1,000, the log's bound), oldest first. Local to this device:
    /// each replica logs the overwrites it saw, that is the pairs where it held one value when
    /// the other arrived.
    ///
    /// The device whose change lost has the entry (it held its value when the winning one
    /// arrived). The winning device has it only if the losing value reached it before being
    /// overwritten: yes when the two devices meet directly (a live change while connected, or
    /// the catch-up when they reconnect); no when the losing change reached it only through a
    /// device that already held the winning value, since sync sends current values only
    /// (docs/ARCHITECTURE.md, "Conflicts").
    public nonisolated func conflicts(includingResolved: Bool = true) throws(ReplicaError) -> [ReplicaConflict] {
        appSupport.learnNames(from: self)
        return try ReplicaError.wrapping {
            let stored = try store.storedConflicts(unresolvedOnly: !includingResolved)
            let roster = self.roster()
            // Each writer's name is resolved once and kept with the entry (relaunches, a writer
            // removed or renamed later: the conflict says who wrote it then).
            var naming: [(id: Int64, winner: String?, loser: String?)] = []
            let conflicts = stored.map { entry -> ReplicaConflict in
                let winner = entry.winnerName ?? writerName(of: entry.entry.winner.dot.replica, roster: roster)
                let loser = entry.loserName ?? writerName(of: entry.entry.loser.dot.replica, roster: roster)
                if (entry.winnerName == nil && winner != nil) || (entry.loserName == nil && loser != nil) {
                    naming.append((entry.id, winner, loser))
                }
                return conflict(entry, winnerName: winner, loserName: loser)
            }
            try? store.nameConflicts(naming)  // a read-only store still shows the names
            return conflicts
        }
    }

    /// Conflicts not yet marked resolved, now and whenever the list changes (a new conflict, one
    /// marked resolved, a writer's name learned). Same semantics as the live queries
    /// (``ReplicaObservation``).
    public nonisolated func observeConflicts() -> ReplicaObservation<[ReplicaConflict]> {
        appSupport.learnNames(from: self)
        return ReplicaObservation(replica: self) { ConflictsReducer() }
    }

    /// Marks the conflict `id` resolved (persisted; survives a restart), or with `false`
    /// pending again. Returns false if there is no such conflict (the log keeps the newest 1,000).
    @discardableResult
    public nonisolated func resolveConflict(_ id: ReplicaConflict.ID, resolved: Bool = true) throws(ReplicaError) -> Bool {
        try ReplicaError.wrapping { try store.markConflict(id, resolved: resolved) }
    }

    /// Names a replica for conflict displays (nil forgets it). The sync layer calls it for
    /// every peer it meets; an app may call it for replicas it knows by other means.
    public nonisolated func setPeerName(_ name: String?, for replicaID: ReplicaID) {
        appSupport.setName(name, for: replicaID)
        store.commits.publishConflictsChanged()  // observed conflict lists show the name
    }

    /// The name of replica `id` as far as this replica knows it: this device's own name, the
    /// name the group's roster gives the device that claims `id` (it survives relaunches, and
    /// follows renames), or a name learned from a peer or ``setPeerName(_:for:)``.
    public nonisolated func peerName(of id: ReplicaID) -> String? {
        writerName(of: id)
    }

    /// ``peerName(of:)`` with the roster already evaluated (a list of conflicts evaluates it
    /// once), or from `state` (inside a transaction, where reading the store's state again
    /// would wait on the transaction's own lock).
    nonisolated func writerName(of id: ReplicaID, roster: Roster? = nil, in state: ReplicaState? = nil) -> String? {
        let state = state ?? self.state
        if id == state.replicaID { return state.name }
        let roster = roster ?? state.roster(of: groupID)
        if let device = roster.claimant(of: id) ?? roster.claimsOfRemovedDevices[id], let name = roster.devices[device]?.name {
            return name
        }
        return appSupport.name(of: id)
    }

    private nonisolated func conflict(_ stored: StoredConflict, winnerName: String?, loserName: String?) -> ReplicaConflict {
        let entry = stored.entry
        func write(_ register: FieldRegister, _ name: String?) -> ReplicaConflict.Write {
            ReplicaConflict.Write(value: register.value, writer: register.dot.replica, writerName: name, timestamp: register.timestamp)
        }
        return ReplicaConflict(id: stored.id, record: entry.key, field: entry.field, winner: write(entry.winner, winnerName),
                               loser: write(entry.loser, loserName), detectedAt: Date(hybridTimestamp: entry.detectedAt),
                               isResolved: stored.isResolved)
    }
}

/// The unresolved conflicts, read again from the store whenever the log changes.
struct ConflictsReducer: ObservationReducer {
    private var value: [ReplicaConflict]?

    var interest: CommitInterest { CommitInterest(collections: [], conflicts: true) }

    mutating func load(_ state: ReplicaState, replica: Replica) throws -> [ReplicaConflict] {
        let current = try replica.conflicts(includingResolved: false)
        value = current
        return current
    }

    mutating func update(_ changes: PendingChanges, _ state: ReplicaState, replica: Replica) throws -> [ReplicaConflict]? {
        let current = try replica.conflicts(includingResolved: false)
        if current == value { return nil }
        value = current
        return current
    }
}
