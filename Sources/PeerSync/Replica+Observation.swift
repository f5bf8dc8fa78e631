import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel

extension Replica {
    // MARK: - Queries

    /// The records `query` keeps, in its order.
    ///
    /// - Complexity: O(n log n) for n records of the type (a live query does this once, then
    ///   works per change).
    public nonisolated func fetchAll<Record: SyncRecord>(_ query: RecordQuery<Record>) throws(ReplicaError) -> [Record] {
        try ReplicaError.wrapping(otherwise: ReplicaError.invalidRecord) { try query.evaluate(state, noting: appSupport.reads) }
    }

    /// The records of `type` that `predicate` keeps, ordered by ID:
    /// `replica.fetchAll(ShiftType.self, where: \.locationID == ward.id)`.
    public nonisolated func fetchAll<Record: SyncRecord>(_ type: Record.Type, where predicate: RecordPredicate<Record>) throws(ReplicaError) -> [Record] {
        try fetchAll(RecordQuery(type, where: predicate))
    }

    /// The records of `type` that `predicate` keeps, ordered by `sortedBy`, then by ID.
    public nonisolated func fetchAll<Record: SyncRecord, Comparator: SortComparator & Sendable>(
        _ type: Record.Type, where predicate: RecordPredicate<Record> = .all, sortedBy comparators: [Comparator]
    ) throws(ReplicaError) -> [Record] where Comparator.Compared == Record {
        try fetchAll(RecordQuery(type, where: predicate, sortedBy: comparators))
    }

    /// The records of `type` for which `isIncluded` is true, ordered by ID.
    public nonisolated func fetchAll<Record: SyncRecord>(
        _ type: Record.Type, where isIncluded: @escaping @Sendable (Record) -> Bool
    ) throws(ReplicaError) -> [Record] {
        try fetchAll(RecordQuery(type, where: isIncluded))
    }

    /// The records of `type` for which `isIncluded` is true, ordered by `sortedBy`, then by ID.
    public nonisolated func fetchAll<Record: SyncRecord, Comparator: SortComparator & Sendable>(
        _ type: Record.Type, where isIncluded: @escaping @Sendable (Record) -> Bool, sortedBy comparators: [Comparator]
    ) throws(ReplicaError) -> [Record] where Comparator.Compared == Record {
        try fetchAll(RecordQuery(type, where: isIncluded, sortedBy: comparators))
    }

    // MARK: - Live queries

    /// The records `query` keeps, now and after every change that alters them (see
    /// ``ReplicaObservation`` for the guarantees).
    ///
    /// ```swift
    /// let query = RecordQuery(ShiftType.self, where: \.locationID == ward.id, sortedBy: [KeyPathComparator(\.title)])
    /// for try await shiftTypes in replica.observe(query) { tableView.show(shiftTypes) }
    /// ```
    public nonisolated func observe<Record: SyncRecord>(_ query: RecordQuery<Record>) -> ReplicaObservation<[Record]> {
        ReplicaObservation(replica: self) { QueryReducer(query: query) }
    }

    /// ``observe(_:)`` with the time its window (``RecordQuery/during(_:at:)``) follows given
    /// by `clock`, starting at `start`: for tests that move a "this week" query past midnight
    /// by advancing a clock of their own.
    public nonisolated func observe<Record: SyncRecord, C: Clock>(
        _ query: RecordQuery<Record>, clock: C, startingAt start: Date
    ) -> ReplicaObservation<[Record]> where C.Duration == Duration {
        let time = ObservationTime.following(clock, startingAt: start)
        return ReplicaObservation(replica: self) { QueryReducer(query: query, time: time) }
    }

    /// The records of `type` that `predicate` keeps (all of them by default), ordered by ID,
    /// now and after every change that alters them.
    public nonisolated func observe<Record: SyncRecord>(
        _ type: Record.Type, where predicate: RecordPredicate<Record> = .all
    ) -> ReplicaObservation<[Record]> {
        observe(RecordQuery(type, where: predicate))
    }

    /// The records of `type` that `predicate` keeps, ordered by `sortedBy` (then ID), now and
    /// after every change that alters them.
    public nonisolated func observe<Record: SyncRecord, Comparator: SortComparator & Sendable>(
        _ type: Record.Type, where predicate: RecordPredicate<Record> = .all, sortedBy comparators: [Comparator]
    ) -> ReplicaObservation<[Record]> where Comparator.Compared == Record {
        observe(RecordQuery(type, where: predicate, sortedBy: comparators))
    }

    /// The records of `type` for which `isIncluded` is true, ordered by ID, now and after
    /// every change that alters them.
    public nonisolated func observe<Record: SyncRecord>(
        _ type: Record.Type, where isIncluded: @escaping @Sendable (Record) -> Bool
    ) -> ReplicaObservation<[Record]> {
        observe(RecordQuery(type, where: isIncluded))
    }

    /// The records of `type` for which `isIncluded` is true, ordered by `sortedBy` (then ID),
    /// now and after every change that alters them.
    public nonisolated func observe<Record: SyncRecord, Comparator: SortComparator & Sendable>(
        _ type: Record.Type, where isIncluded: @escaping @Sendable (Record) -> Bool, sortedBy comparators: [Comparator]
    ) -> ReplicaObservation<[Record]> where Comparator.Compared == Record {
        observe(RecordQuery(type, where: isIncluded, sortedBy: comparators))
    }

    /// One record, now and after every change to it (nil while it does not exist or is
    /// deleted). A change to a record it references counts when it makes the reference read
    /// differently (a deleted target reads nil).
    public nonisolated func observe<Record: SyncRecord>(_ type: Record.Type, id: UUID) -> ReplicaObservation<Record?> {
        ReplicaObservation(replica: self) { RecordReducer<Record>(id: id) }
    }

    /// One setting's value (nil while unset), now and after every change to it.
    public nonisolated func observeSetting(_ key: String, scope: SettingScope) -> ReplicaObservation<FieldValue?> {
        ReplicaObservation(replica: self) { SettingReducer(key: key, scope: scope) }
    }

    /// All set settings of `scope`, now and after every change to them.
    public nonisolated func observeSettings(scope: SettingScope) -> ReplicaObservation<[String: FieldValue]> {
        ReplicaObservation(replica: self) { SettingsReducer(scope: scope) }
    }

    // MARK: - References

    /// The record `reference` points at, or nil if it does not exist (never arrived here, or
    /// was deleted).
    public nonisolated func resolve<Target: SyncRecord>(_ reference: Reference<Target>) throws(ReplicaError) -> Target? {
        try fetch(Target.self, id: reference.id)
    }

    /// The record `reference` points at, or nil if there is no reference or no such record.
    public nonisolated func resolve<Target: SyncRecord>(_ reference: Reference<Target>?) throws(ReplicaError) -> Target? {
        guard let reference else { return nil }
        return try resolve(reference)
    }

    /// The records of `type` whose declared reference fields point at `target`:
    /// `replica.fetchAll(ShiftType.self, referencing: ward)`.
    public nonisolated func fetchAll<Record: SyncRecord, Target: SyncRecord>(
        _ type: Record.Type, referencing target: Target
    ) throws(ReplicaError) -> [Record] {
        try fetchAll(type, where: .referencing(target))
    }
}
