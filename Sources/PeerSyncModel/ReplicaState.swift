@_spi(Engine) import PeerSyncCRDT

/// Everything one replica holds, as a value: its identity, clock, synced records and settings,
/// device-local settings and conflict log. No I/O: the store persists it, the session ships
/// the deltas its mutators return.
///
/// Every mutator that changes synced state returns the delta to send to peers (already applied
/// here); `nil` means nothing changed.
///
/// A local change can fail in one way: the replica has used its last event counter
/// (``CounterExhaustedError``; only a hostile peer can bring that about). ``save(_:)`` throws
/// it. The other mutators keep their non-throwing signatures: they change nothing, return no
/// delta (nil, or an empty one from ``write(_:to:)``) and record the error in
/// ``localChangeFailure``; ``ReplicaStore`` throws it from the transaction and writes nothing,
/// and ``throwIfLocalChangeFailed()`` throws it for code that uses the state directly.
package struct ReplicaState: Sendable {
    public let replicaID: ReplicaID
    public var name: String
    public private(set) var clock: HybridLogicalClock
    public private(set) var records: RecordMap
    public private(set) var localSettings: [String: FieldValue]
    public private(set) var conflicts: ConflictLog
    /// Why a local change since the last ``throwIfLocalChangeFailed()`` could not be made, if
    /// one could not (see the type's documentation).
    public private(set) var localChangeFailure: CounterExhaustedError?

    /// A new, empty replica.
    public init(
        replicaID: ReplicaID = .random(), name: String,
        physicalClock: @escaping HybridLogicalClock.PhysicalClock = HybridLogicalClock.wallClock
    ) {
        self.init(replicaID: replicaID, name: name, records: RecordMap(), localSettings: [:],
                  conflicts: ConflictLog(), physicalClock: physicalClock)
    }

    /// A replica from stored parts. The clock starts at the newest timestamp in `records` or
    /// `clockFloor`, whichever is later, so writes after a restart still win.
    public init(
        replicaID: ReplicaID, name: String, records: RecordMap, localSettings: [String: FieldValue],
        conflicts: ConflictLog, clockFloor: HLCTimestamp = .zero,
        physicalClock: @escaping HybridLogicalClock.PhysicalClock = HybridLogicalClock.wallClock
    ) {
        self.replicaID = replicaID
        self.name = name
        self.records = records
        self.localSettings = localSettings
        self.conflicts = conflicts
        var latest = records.maxTimestamp
        latest.merge(clockFloor)
        clock = HybridLogicalClock(latest: latest, physicalClock: physicalClock)
    }

    public var context: CausalContext { records.context }
    public var digest: StateDigest { records.digest }

    /// A fresh timestamp from this replica's clock (e.g. for a signed roster entry written next),
    /// later than every timestamp it has issued or observed.
    public mutating func nextTimestamp() -> HLCTimestamp { clock.tick() }

    /// Advances the clock past `timestamp` (e.g. a signed roster entry's own timestamp, so an
    /// entry signed next sorts after it). Check it against the wall clock first.
    public mutating func observe(_ timestamp: HLCTimestamp) { clock.observe(timestamp) }

    // MARK: - Fields

    /// Throws (and clears) ``localChangeFailure``: the error of a local change made since the
    /// last call that could not be made.
    public mutating func throwIfLocalChangeFailed() throws(CounterExhaustedError) {
        guard let failure = localChangeFailure else { return }
        localChangeFailure = nil
        throw failure
    }

    /// Writes `fields` of the record `key` as one event. Returns the delta.
    ///
    /// If the replica has no event counter left, nothing changes, the delta is empty and
    /// ``localChangeFailure`` says why (the store then refuses the transaction).
    @discardableResult
    public mutating func write(_ fields: [String: FieldValue], to key: RecordKey) -> RecordMap {
        do {
            return try checkedWrite(fields, to: key)
        } catch {
            localChangeFailure = error
            return RecordMap.empty()
        }
    }

    /// ``write(_:to:)`` that throws ``CounterExhaustedError`` instead of recording it.
    mutating func checkedWrite(_ fields: [String: FieldValue], to key: RecordKey) throws(CounterExhaustedError) -> RecordMap {
        guard records.context.canTakeDot(for: replicaID) else { throw CounterExhaustedError(replica: replicaID) }
        return try records.write(fields, to: key, at: clock.tick(), by: replicaID)
    }

    /// Deletes the record `key`. Returns the delta, or nil if it is not visible.
    ///
    /// If the replica has no event counter left, nothing changes, the result is nil and
    /// ``localChangeFailure`` says why (the store then refuses the transaction).
    @discardableResult
    public mutating func delete(_ key: RecordKey) -> RecordMap? {
        do {
            return try records.remove(key, by: replicaID)
        } catch {
            localChangeFailure = error
            return nil
        }
    }

    /// Joins a delta received from a peer: advances the clock past its timestamps and logs
    /// the concurrent overwrites it caused.
    @discardableResult
    public mutating func apply(_ delta: RecordMap) -> MergeOutcome {
        let outcome = records.apply(delta)
        clock.observe(outcome.maxTimestamp)
        for conflict in outcome.conflicts {
            conflicts.record(ConflictEntry(key: conflict.key, field: conflict.field, winner: conflict.winner,
                                           loser: conflict.loser, detectedAt: clock.latest))
        }
        return outcome
    }

    /// Compaction: removes those of `keys` that are purgeable under `stable` (invisible, every
    /// dot stable; ``RecordMap/purge(_:stable:)``) and the conflict log's entries about them.
    /// The context is kept, so they never come back. Call with no keys after loading a stored
    /// state, so it drops echoes of what was purged before.
    @discardableResult
    public mutating func purge(_ keys: some Sequence<RecordKey>, stable: CausalContext) -> RecordMap.PurgeResult {
        forgetConflicts(about: records.purge(keys, stable: stable))
    }

    /// Drops records a complete round showed the group purged while this replica was in the
    /// past (``RecordMap/dropPurgedElsewhere(_:stable:)``), and the conflict log's entries about them.
    @discardableResult
    public mutating func dropPurgedElsewhere(_ keys: [RecordKey], stable: CausalContext) -> RecordMap.PurgeResult {
        forgetConflicts(about: records.dropPurgedElsewhere(keys, stable: stable))
    }

    /// Drops the conflict log's entries about the records `removed` took away; returns `removed`.
    private mutating func forgetConflicts(about removed: RecordMap.PurgeResult) -> RecordMap.PurgeResult {
        guard !removed.isEmpty, !conflicts.entries.isEmpty else { return removed }
        let gone = Set(removed.keys)
        if conflicts.entries.contains(where: { gone.contains($0.key) }) {
            conflicts = ConflictLog(capacity: conflicts.capacity, entries: conflicts.entries.filter { !gone.contains($0.key) })
        }
        return removed
    }

    /// What a peer with context `peer` lacks (the full state for an empty context).
    public func delta(missingFrom peer: CausalContext) -> RecordMap {
        records.delta(missingFrom: peer)
    }

    // MARK: - Typed records

    /// Saves `record`: writes the fields whose values differ from the stored ones (all of them
    /// if the record is not visible), as one event. Fields this type does not know are left as
    /// they are. Returns the delta, or nil if nothing changed.
    ///
    /// A reference (``SyncRecord/references``) whose target is missing or deleted reads as nil,
    /// and nil for it is no change either: the stored ID stays, so the record points at the
    /// target again if it comes back (a concurrent edit revives it). Setting another ID is
    /// written, and so is clearing a reference whose target exists. (To detach a record from a
    /// deleted target for good, write `.null` to the field with ``upsert(_:to:)``.)
    ///
    /// - Throws: an encoding error, or ``CounterExhaustedError`` if the replica has no event
    ///   counter left (nothing changes then).
    @discardableResult
    public mutating func save<R: SyncRecord>(_ record: R) throws -> RecordMap? {
        var fields = try FieldEncoder().encodeFields(record)
        fields["id"] = nil
        guard let changed = changedFields(fields, of: record.recordKey, references: R.references) else { return nil }
        return try checkedWrite(changed, to: record.recordKey)
    }

    /// Writes the given fields of `key` whose values differ from the stored ones (all of them if
    /// the record is not visible), as one event. Returns the delta, or nil if nothing changed.
    ///
    /// If the replica has no event counter left, nothing changes, the result is nil and
    /// ``localChangeFailure`` says why (the store then refuses the transaction).
    @discardableResult
    public mutating func upsert(_ fields: [String: FieldValue], to key: RecordKey) -> RecordMap? {
        guard let changed = changedFields(fields, of: key, references: []) else { return nil }
        do {
            return try checkedWrite(changed, to: key)
        } catch {
            localChangeFailure = error
            return nil
        }
    }

    /// The fields whose values differ from the stored ones (all of them if the record is not
    /// visible); nil if none do. A field in `references` whose stored target is missing or
    /// deleted reads as `.null` (``fetch(_:id:)``), so `.null` for it is no change either.
    func changedFields(_ fields: [String: FieldValue], of key: RecordKey,
                               references: [RecordReference]) -> [String: FieldValue]? {
        guard let existing = records.record(key), existing.isVisible else { return fields }
        let changed = fields.filter { name, value in
            guard let stored = existing.fields[name]?.value else { return true }
            if stored == value { return false }
            return value != .null || !references.contains { $0.field == name && readsAsNil(stored, referenceTo: $0.collection) }
        }
        return changed.isEmpty ? nil : changed
    }

    /// Whether `value`, stored in a field that refers to records of `collection`, reads as nil:
    /// an ID (or its string form) of a record not visible here, or a string that is no ID.
    private func readsAsNil(_ value: FieldValue, referenceTo collection: String) -> Bool {
        switch value {
        case .uuid(let id): !contains(RecordKey(collection: collection, id: id))
        case .string(let text): UUID(uuidString: text).map { !contains(RecordKey(collection: collection, id: $0)) } ?? true
        default: false
        }
    }

    /// Deletes the record of type `R` with `id`. Returns the delta, or nil if it does not exist.
    @discardableResult
    public mutating func delete<R: SyncRecord>(_ type: R.Type, id: UUID) -> RecordMap? {
        delete(RecordKey(collection: R.collection, id: id))
    }

    /// The visible record of type `R` with `id`, or nil.
    public func fetch<R: SyncRecord>(_ type: R.Type, id: UUID) throws -> R? {
        let key = RecordKey(collection: R.collection, id: id)
        guard let state = records.record(key), state.isVisible else { return nil }
        return try decode(type, id: id, state: state)
    }

    /// All visible records of type `R`, in no particular order.
    public func fetchAll<R: SyncRecord>(_ type: R.Type) throws -> [R] {
        try records.records(in: R.collection).compactMap { id, state in
            state.isVisible ? try decode(type, id: id, state: state) : nil
        }
    }

    /// Whether a visible record `key` exists.
    public func contains(_ key: RecordKey) -> Bool {
        records.record(key)?.isVisible ?? false
    }

    private func decode<R: SyncRecord>(_ type: R.Type, id: UUID, state: RecordState) throws -> R {
        var fields = state.values
        fields["id"] = .string(id.uuidString)
        for reference in R.references {
            if let value = fields[reference.field], readsAsNil(value, referenceTo: reference.collection) {
                fields[reference.field] = .null
            }
        }
        return try FieldDecoder().decode(type, fromFields: fields)
    }

    // MARK: - Settings

    /// Sets (or with `nil`, unsets) a setting. Synced settings return the delta to send;
    /// local ones return nil.
    @discardableResult
    public mutating func setSetting(_ key: String, to value: FieldValue?, scope: SettingScope) -> RecordMap? {
        switch scope {
        case .local:
            localSettings[key] = value
            return nil
        case .synced:
            let newValue = value ?? .null
            let current = records.record(.syncedSettings)?.fields[key]?.value
            if current == newValue || (current == nil && newValue == .null) { return nil }
            do {
                return try checkedWrite([key: newValue], to: .syncedSettings)
            } catch {
                localChangeFailure = error
                return nil
            }
        }
    }

    /// The value of a setting, or nil if unset.
    public func setting(_ key: String, scope: SettingScope) -> FieldValue? {
        settings(scope: scope)[key]
    }

    /// All set settings of one scope.
    public func settings(scope: SettingScope) -> [String: FieldValue] {
        switch scope {
        case .local: localSettings
        case .synced: (records.record(.syncedSettings)?.values ?? [:]).filter { $0.value != .null }
        }
    }
}
