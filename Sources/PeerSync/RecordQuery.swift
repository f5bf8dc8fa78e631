import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel

/// Which records of a type a query keeps.
///
/// ```swift
/// RecordPredicate<ShiftType> { $0.duration > 8 * 3600 }   // any test on the record
/// \ShiftType.locationID == ward.id                         // a property equals a value
/// RecordPredicate<ShiftType>.referencing(ward)             // a declared reference points at it
/// ```
public struct RecordPredicate<Record: SyncRecord>: Sendable {
    private indirect enum Test: Sendable {
        case all
        case closure(@Sendable (Record) -> Bool)
        case referencing(RecordKey)
        case and(RecordPredicate, RecordPredicate)
    }
    private let test: Test

    private init(test: Test) {
        self.test = test
    }

    /// Every record.
    public static var all: RecordPredicate { RecordPredicate(test: .all) }

    /// Records for which `isIncluded` returns true.
    public init(_ isIncluded: @escaping @Sendable (Record) -> Bool) {
        test = .closure(isIncluded)
    }

    /// Records with a field declared in ``SyncRecord/references`` that points at `target`
    /// while it exists (a dangling reference reads nil, so it matches nothing).
    public static func referencing(_ target: RecordKey) -> RecordPredicate {
        RecordPredicate(test: .referencing(target))
    }

    /// Records with a declared reference to `target`.
    public static func referencing<Target: SyncRecord>(_ target: Target) -> RecordPredicate {
        .referencing(target.recordKey)
    }

    /// Records with a declared reference to the record `reference` names.
    public static func referencing<Target: SyncRecord>(_ reference: Reference<Target>) -> RecordPredicate {
        .referencing(reference.key)
    }

    /// Records both predicates keep.
    public static func && (lhs: RecordPredicate, rhs: RecordPredicate) -> RecordPredicate {
        RecordPredicate(test: .and(lhs, rhs))
    }

    /// Whether `record` (read from `raw` in `state`) is kept.
    func matches(_ record: Record, raw: RecordState, in state: ReplicaState) -> Bool {
        switch test {
        case .all:
            return true
        case .closure(let isIncluded):
            return isIncluded(record)
        case .referencing(let target):
            guard state.contains(target) else { return false }
            return Record.references.contains { reference in
                reference.collection == target.collection && referencedID(raw.fields[reference.field]?.value) == target.id
            }
        case .and(let lhs, let rhs):
            return lhs.matches(record, raw: raw, in: state) && rhs.matches(record, raw: raw, in: state)
        }
    }
}

/// The UUID a reference field holds (as a UUID value or its string form), if any.
func referencedID(_ value: FieldValue?) -> UUID? {
    switch value {
    case .uuid(let id)?: id
    case .string(let text)?: UUID(uuidString: text)
    default: nil
    }
}

/// Keeps the records whose property at `keyPath` equals `value`:
/// `replica.fetchAll(ShiftType.self, where: \.locationID == ward.id)`.
public func == <Record: SyncRecord, Value: Equatable & Sendable>(
    keyPath: KeyPath<Record, Value> & Sendable, value: Value
) -> RecordPredicate<Record> {
    RecordPredicate { $0[keyPath: keyPath] == value }
}

/// What a live query or fetch returns: the records of one type that a predicate keeps, in an
/// order. Ties (and queries without a sort order) fall back to the record ID, so the order is
/// total and the same on every device.
///
/// ```swift
/// let nights = RecordQuery(ShiftType.self, where: { $0.symbol == "N" },
///                          sortedBy: [KeyPathComparator(\.title)])
/// for try await shiftTypes in replica.observe(nights) { … }
/// ```
///
/// Sort with any `SortComparator` (Foundation's `KeyPathComparator` or `SortDescriptor`).
public struct RecordQuery<Record: SyncRecord>: Sendable {
    /// Which records the query keeps.
    public var predicate: RecordPredicate<Record>
    private var comparators: [@Sendable (Record, Record) -> ComparisonResult] = []
    /// A window of time relative to now that a date of each record must fall in (``during(_:at:)``).
    private(set) var window: TimeWindow?

    /// A window relative to now: `interval(now)` is its extent (start included, end not);
    /// `date` reads the record's date.
    struct TimeWindow: Sendable {
        let interval: @Sendable (Date) -> DateInterval
        let date: @Sendable (Record) -> Date

        func contains(_ record: Record, now: Date) -> Bool {
            let extent = interval(now)
            let date = date(record)
            return date >= extent.start && date < extent.end
        }
    }

    /// All records of `Record` that `predicate` keeps, ordered by ID.
    public init(_ type: Record.Type = Record.self, where predicate: RecordPredicate<Record> = .all) {
        self.predicate = predicate
    }

    /// All records of `Record` that `isIncluded` keeps, ordered by ID.
    public init(_ type: Record.Type = Record.self, where isIncluded: @escaping @Sendable (Record) -> Bool) {
        predicate = RecordPredicate(isIncluded)
    }

    /// All records `predicate` keeps, ordered by `comparators` (the first that tells two
    /// records apart decides), then by ID.
    public init<Comparator: SortComparator & Sendable>(
        _ type: Record.Type = Record.self, where predicate: RecordPredicate<Record> = .all, sortedBy comparators: [Comparator]
    ) where Comparator.Compared == Record {
        self.predicate = predicate
        self.comparators = comparators.map { comparator in { comparator.compare($0, $1) } }
    }

    /// All records `isIncluded` keeps, ordered by `comparators`, then by ID.
    public init<Comparator: SortComparator & Sendable>(
        _ type: Record.Type = Record.self, where isIncluded: @escaping @Sendable (Record) -> Bool, sortedBy comparators: [Comparator]
    ) where Comparator.Compared == Record {
        self.init(type, where: RecordPredicate(isIncluded), sortedBy: comparators)
    }

    /// This query, also ordered by `comparator` where the earlier ones tie.
    public func sorted<Comparator: SortComparator & Sendable>(by comparator: Comparator) -> RecordQuery
    where Comparator.Compared == Record {
        var query = self
        query.comparators.append { comparator.compare($0, $1) }
        return query
    }

    /// This query, keeping only records whose date at `date` falls in `window(now)` — start
    /// included, end not — a window relative to the current time that moves as time passes:
    ///
    /// ```swift
    /// let thisWeek = RecordQuery(Shift.self, sortedBy: [KeyPathComparator(\.start)])
    ///     .during({ now in Calendar.current.dateInterval(of: .weekOfYear, for: now)! }, at: \.start)
    /// for try await shifts in replica.observe(thisWeek) { … }    // moves on to next week by itself
    /// ```
    ///
    /// A live query evaluates the window when it starts and again each time now reaches the
    /// window's end, so windows with fixed boundaries (today, this week, this month, "from today
    /// to the end of next week") move exactly when they should. A fetch evaluates it once.
    public func during(_ window: @escaping @Sendable (_ now: Date) -> DateInterval,
                       at date: KeyPath<Record, Date> & Sendable) -> RecordQuery {
        var query = self
        query.window = TimeWindow(interval: window, date: { $0[keyPath: date] })
        return query
    }

    /// Whether the query keeps `record` (read from `raw` in `state`) at `now`.
    func keeps(_ record: Record, raw: RecordState, in state: ReplicaState, now: Date) -> Bool {
        predicate.matches(record, raw: raw, in: state) && (window?.contains(record, now: now) ?? true)
    }

    /// This query, keeping only what `predicate` also keeps.
    public func filter(_ predicate: RecordPredicate<Record>) -> RecordQuery {
        var query = self
        query.predicate = self.predicate && predicate
        return query
    }

    /// Whether `a` comes before `b`: by the comparators, then by ID.
    func areInIncreasingOrder(_ a: Record, _ b: Record) -> Bool {
        for compare in comparators {
            switch compare(a, b) {
            case .orderedAscending: return true
            case .orderedDescending: return false
            case .orderedSame: continue
            }
        }
        return idPrecedes(a.id, b.id)
    }

    /// Evaluates the query over `state` from scratch.
    ///
    /// - Complexity: O(n log n) for n records of the type.
    /// `noting`: the replica's ledger of records handed to the app (see ``Replica/save(_:)``).
    func evaluate(_ state: ReplicaState, noting reads: ReadLedger? = nil, now: Date = Date()) throws -> [Record] {
        var result: [Record] = []
        for (id, raw) in state.records.records(in: Record.collection) where raw.isVisible {
            guard let record = try state.fetch(Record.self, id: id), keeps(record, raw: raw, in: state, now: now) else { continue }
            reads?.note(RecordKey(collection: Record.collection, id: id), raw)
            result.append(record)
        }
        result.sort(by: areInIncreasingOrder)
        return result
    }
}

/// Orders UUIDs by their bytes.
func idPrecedes(_ a: UUID, _ b: UUID) -> Bool {
    withUnsafeBytes(of: a.uuid) { x in
        withUnsafeBytes(of: b.uuid) { y in
            let (a0, a1) = (x.loadUnaligned(as: UInt64.self).bigEndian, x.loadUnaligned(fromByteOffset: 8, as: UInt64.self).bigEndian)
            let (b0, b1) = (y.loadUnaligned(as: UInt64.self).bigEndian, y.loadUnaligned(fromByteOffset: 8, as: UInt64.self).bigEndian)
            return a0 != b0 ? a0 < b0 : a1 < b1
        }
    }
}
