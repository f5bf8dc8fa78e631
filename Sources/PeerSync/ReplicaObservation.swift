import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import PeerSyncStore

/// A live value read from a replica: the current value at once, then a new one each time a
/// change touches it — made here, received from a peer, or committed by another process on
/// the same store.
///
/// - **Coalesced**: changes that arrive while the consumer is busy produce one element, the
///   latest value. An element is never equal to the one before it, with one exception: a
///   change to a record that a kept record references through ``SyncRecord/references`` (a
///   shift type renamed) produces the result again, so rows that show the referenced record
///   refresh.
/// - **Consistent and in order**: each element is the value in one committed state of the
///   replica, and states only move forward (never half a batch, never an older state after a
///   newer one).
/// - **Cheap per change**: only the records a change touched are read again (plus, for types
///   with ``SyncRecord/references``, the records pointing at a record that appeared or
///   vanished); a sorted result is kept and updated by binary search.
/// - While any observation is being iterated, the replica watches its store for other
///   processes' commits (as it does while sync is on) and stops when the last one ends.
///
/// Iterate it in a task; leaving the loop or cancelling the task ends the observation.
///
/// ```swift
/// for try await nights in replica.observe(ShiftType.self, where: { $0.symbol == "N" }) {
///     show(nights)
/// }
/// ```
///
/// It throws only if a stored record cannot be decoded as the requested type, or the store
/// cannot be read; the sequence ends after that.
public struct ReplicaObservation<Element: Sendable>: AsyncSequence, Sendable {
    /// Decoding (``ReplicaError/invalidRecord(_:)``) or storage errors end the sequence.
    public typealias Failure = ReplicaError
    private let makeDriver: @Sendable () -> ObservationDriverBase<Element>

    init<Reducer: ObservationReducer>(replica: Replica, _ reducer: @escaping @Sendable () -> Reducer)
    where Reducer.Value == Element {
        makeDriver = { ObservationDriver(replica: replica, reducer: reducer()) }
    }

    /// A new observation of its own: subscribes on its first `next()`.
    public func makeAsyncIterator() -> Iterator {
        Iterator(driver: makeDriver())
    }

    /// Iterates a ``ReplicaObservation``; each iterator is an observation of its own.
    public struct Iterator: AsyncIteratorProtocol {
        public typealias Failure = ReplicaError
        private let driver: ObservationDriverBase<Element>

        init(driver: ObservationDriverBase<Element>) {
            self.driver = driver
        }

        /// The current value on the first call; afterwards waits for the next different value.
        /// Returns nil when the task is cancelled.
        public mutating func next() async throws(ReplicaError) -> Element? {
            do { return try await driver.next() } catch { throw ReplicaError(error, otherwise: ReplicaError.storage) }
        }
    }
}

/// What an observation computes, from scratch and then from changes.
protocol ObservationReducer: Sendable {
    associatedtype Value: Sendable
    /// The changes to be told about.
    var interest: CommitInterest { get }
    /// The value in `state`.
    mutating func load(_ state: ReplicaState, replica: Replica) throws -> Value
    /// The value after `changes`, read from `state` (which holds at least them), or nil if
    /// it is the same as the last one returned.
    mutating func update(_ changes: PendingChanges, _ state: ReplicaState, replica: Replica) throws -> Value?
    /// The time the value depends on, if it does (a query with a window relative to now).
    var time: ObservationTime? { get }
    /// When the value must be looked at again although nothing changed (by ``time``), if ever.
    var deadline: Date? { get }
    /// The value now that ``deadline`` has passed, or nil if it is the same.
    mutating func timePassed(_ state: ReplicaState, replica: Replica) throws -> Value?
}

extension ObservationReducer {
    var time: ObservationTime? { nil }
    var deadline: Date? { nil }
    mutating func timePassed(_ state: ReplicaState, replica: Replica) throws -> Value? { nil }
}

/// The time a live query's window follows: what time it is, and waiting until a moment.
struct ObservationTime: Sendable {
    let now: @Sendable () -> Date
    /// Returns at `date` or later (by ``now``); throws when the task is cancelled.
    let sleep: @Sendable (_ until: Date) async throws -> Void

    /// The system's wall clock (checked again after each wait: it may be set meanwhile).
    static let system = ObservationTime(now: { Date() }, sleep: { date in
        while true {
            let remaining = date.timeIntervalSinceNow
            if remaining <= 0 { return }
            try await Task.sleep(for: .seconds(min(remaining, 3_600)))
        }
    })

    /// Time as `clock` measures it from now on, starting at `start` (tests inject a clock they
    /// advance by hand).
    static func following<C: Clock>(_ clock: C, startingAt start: Date) -> ObservationTime where C.Duration == Duration {
        let origin = clock.now
        return ObservationTime(
            now: {
                let elapsed = origin.duration(to: clock.now)
                return start.addingTimeInterval(Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18)
            },
            sleep: { date in try await clock.sleep(until: origin.advanced(by: .seconds(date.timeIntervalSince(start))), tolerance: nil) })
    }
}

class ObservationDriverBase<Element: Sendable> {
    func next() async throws -> Element? { nil }
}

/// Runs one observation: subscribes to the store's commit feed, then takes consistent
/// snapshots and hands the reducer the changes each one includes.
final class ObservationDriver<Reducer: ObservationReducer>: ObservationDriverBase<Reducer.Value> {
    private let replica: Replica
    private var reducer: Reducer
    private var subscription: CommitSubscription?
    private var lease: WatchLease?
    private var started = false
    private var finished = false

    init(replica: Replica, reducer: Reducer) {
        self.replica = replica
        self.reducer = reducer
    }

    deinit {
        subscription?.cancel()
    }

    override func next() async throws -> Reducer.Value? {
        guard !finished else { return nil }
        do {
            return try await produce()
        } catch {
            finish()
            throw error
        }
    }

    private func produce() async throws -> Reducer.Value? {
        if !started {
            started = true
            // Subscribe before the first snapshot, so no change can fall between the two.
            let subscription = replica.store.commits.subscribe(reducer.interest)
            self.subscription = subscription
            lease = replica.appSupport.watchOtherProcesses(replica)
            let (state, sequence) = replica.store.consistentSnapshot()
            let value = try reducer.load(state, replica: replica)
            let pending = subscription.drain()
            if pending.newestSequence > sequence { subscription.requeue(pending) }
            return value
        }
        guard let subscription else { return nil }
        while true {
            // A value that depends on the time is looked at again when its deadline comes.
            let timer = reducer.deadline.flatMap { deadline in
                reducer.time.map { time in
                    Task {
                        do { try await time.sleep(deadline) } catch { return }
                        subscription.poke()
                    }
                }
            }
            let woke = await subscription.waitForChanges()
            timer?.cancel()
            guard woke else { break }
            // Snapshot first, then drain: everything drained at or below the snapshot's
            // sequence is in it; anything newer is looked at again next round.
            let (state, sequence) = replica.store.consistentSnapshot()
            let pending = subscription.drain()
            var value: Reducer.Value?
            if !pending.isEmpty {
                value = try reducer.update(pending, state, replica: replica)
                if pending.newestSequence > sequence { subscription.requeue(pending) }
                replica.appSupport.countObservationRound()
            }
            if value == nil, let deadline = reducer.deadline, let time = reducer.time, time.now() >= deadline {
                value = try reducer.timePassed(state, replica: replica)
            }
            if let value { return value }
        }
        finish()
        return nil
    }

    private func finish() {
        finished = true
        subscription?.cancel()
        subscription = nil
        lease = nil
    }
}

// MARK: - Records

/// A sorted live result: the records a query keeps, with the encoded fields of each (to tell
/// a real change from a rewrite of the same values) and an index of reference fields (to
/// re-read the records pointing at a record that appeared or vanished).
struct QueryReducer<Record: SyncRecord>: ObservationReducer {
    private struct Member {
        var record: Record
        var fields: [String: FieldValue]
    }

    let query: RecordQuery<Record>
    let time: ObservationTime?
    /// The query's window of time as last evaluated, and the moment it was evaluated at.
    private var window: DateInterval?
    private var evaluatedAt = Date()
    private var members: [UUID: Member] = [:]
    private var sorted: [Record] = []
    /// Target record → records of `Record` whose declared reference fields hold its ID.
    private var referrers: [RecordKey: Set<UUID>] = [:]
    private var targetsByRecord: [UUID: [RecordKey]] = [:]
    /// Whether each referenced target was visible when last looked at.
    private var targetVisible: [RecordKey: Bool] = [:]
    /// The replica's ledger of records handed out (set at load).
    private var reads: ReadLedger?

    init(query: RecordQuery<Record>, time: ObservationTime = .system) {
        self.query = query
        self.time = query.window == nil ? nil : time
    }

    var deadline: Date? { window?.end }

    mutating func timePassed(_ state: ReplicaState, replica: Replica) throws -> [Record]? {
        let before = sorted.map { ($0.id, members[$0.id]!.fields) }
        _ = try load(state, replica: replica)
        let after = sorted.map { ($0.id, members[$0.id]!.fields) }
        return before.elementsEqual(after, by: { $0.0 == $1.0 && $0.1 == $1.1 }) ? nil : sorted
    }

    var interest: CommitInterest {
        CommitInterest(collections: Set([Record.collection] + Record.references.map(\.collection)))
    }

    var records: [Record] { sorted }

    mutating func load(_ state: ReplicaState, replica: Replica) throws -> [Record] {
        members = [:]
        referrers = [:]
        targetsByRecord = [:]
        targetVisible = [:]
        var unsorted: [Record] = []
        reads = replica.appSupport.reads
        if let time {
            evaluatedAt = time.now()
            window = query.window?.interval(evaluatedAt)
        }
        for (id, raw) in state.records.records(in: Record.collection) {
            index(id, raw, state)
            guard let member = try member(id, raw, state) else { continue }
            members[id] = member
            unsorted.append(member.record)
        }
        sorted = unsorted.sorted(by: query.areInIncreasingOrder)
        return sorted
    }

    mutating func update(_ changes: PendingChanges, _ state: ReplicaState, replica: Replica) throws -> [Record]? {
        if changes.reload {
            let before = sorted.map { ($0.id, members[$0.id]!.fields) }
            _ = try load(state, replica: replica)
            let after = sorted.map { ($0.id, members[$0.id]!.fields) }
            return before.elementsEqual(after, by: { $0.0 == $1.0 && $0.1 == $1.1 }) ? nil : sorted
        }
        var affected: Set<UUID> = []
        // A record a kept record references changed (a shift type renamed): the rows that show
        // it must refresh, so the result comes again even if no kept record changed.
        var referencedChanged = false
        for key in changes.keys {
            if key.collection == Record.collection { affected.insert(key.id) }
            if let ids = referrers[key] {
                let visible = state.contains(key)
                if targetVisible[key] != visible {
                    targetVisible[key] = visible
                    affected.formUnion(ids)
                } else if visible, ids.contains(where: { members[$0] != nil }) {
                    referencedChanged = true
                }
            }
        }
        var changed = referencedChanged
        for id in affected {
            let raw = state.records.record(RecordKey(collection: Record.collection, id: id))
            if let raw { index(id, raw, state) } else { unindex(id) }
            let new = try raw.flatMap { try member(id, $0, state) }
            if try replace(id, with: new) { changed = true }
        }
        return changed ? sorted : nil
    }

    /// The member for record `id` if it is visible and the predicate keeps it.
    private func member(_ id: UUID, _ raw: RecordState, _ state: ReplicaState) throws -> Member? {
        guard raw.isVisible, let record = try state.fetch(Record.self, id: id),
              query.keeps(record, raw: raw, in: state, now: evaluatedAt) else { return nil }
        reads?.note(RecordKey(collection: Record.collection, id: id), raw)
        return Member(record: record, fields: try FieldEncoder().encodeFields(record))
    }

    /// Puts `new` in place of the member `id`; returns whether the result changed.
    private mutating func replace(_ id: UUID, with new: Member?) throws -> Bool {
        let old = members[id]
        if old == nil && new == nil { return false }
        if let old, let new, old.fields == new.fields { return false }
        if let old {
            var at = position(of: old.record)
            if at >= sorted.count || sorted[at].id != id {
                // Only a comparator that is not a strict weak order (NaN keys…) gets here.
                at = sorted.firstIndex { $0.id == id } ?? -1
            }
            if at >= 0 { sorted.remove(at: at) }
        }
        if let new { sorted.insert(new.record, at: position(of: new.record)) }
        members[id] = new
        return true
    }

    /// The first index whose record does not come before `record` (binary search).
    private func position(of record: Record) -> Int {
        var low = 0
        var high = sorted.count
        while low < high {
            let mid = (low + high) / 2
            if query.areInIncreasingOrder(sorted[mid], record) { low = mid + 1 } else { high = mid }
        }
        return low
    }

    private mutating func index(_ id: UUID, _ raw: RecordState, _ state: ReplicaState) {
        guard !Record.references.isEmpty else { return }
        var targets: [RecordKey] = []
        for reference in Record.references {
            if let target = referencedID(raw.fields[reference.field]?.value) {
                targets.append(RecordKey(collection: reference.collection, id: target))
            }
        }
        if targetsByRecord[id] == targets { return }
        unindex(id)
        guard !targets.isEmpty else { return }
        targetsByRecord[id] = targets
        for target in targets {
            referrers[target, default: []].insert(id)
            if targetVisible[target] == nil { targetVisible[target] = state.contains(target) }
        }
    }

    private mutating func unindex(_ id: UUID) {
        guard let old = targetsByRecord.removeValue(forKey: id) else { return }
        for target in old {
            referrers[target]?.remove(id)
            if referrers[target]?.isEmpty == true {
                referrers[target] = nil
                targetVisible[target] = nil
            }
        }
    }
}

/// One record by ID (nil while it does not exist).
struct RecordReducer<Record: SyncRecord>: ObservationReducer {
    let id: UUID
    private var fields: [String: FieldValue]?

    init(id: UUID) {
        self.id = id
    }

    var interest: CommitInterest {
        CommitInterest(collections: Set([Record.collection] + Record.references.map(\.collection)))
    }

    mutating func load(_ state: ReplicaState, replica: Replica) throws -> Record? {
        let record = try state.fetch(Record.self, id: id)
        fields = try record.map { try FieldEncoder().encodeFields($0) }
        let key = RecordKey(collection: Record.collection, id: id)
        if record != nil, let raw = state.records.record(key) { replica.appSupport.reads.note(key, raw) }
        return record
    }

    mutating func update(_ changes: PendingChanges, _ state: ReplicaState, replica: Replica) throws -> Record?? {
        let key = RecordKey(collection: Record.collection, id: id)
        if !changes.reload && !changes.keys.contains(key) {
            // Only a change to a record this one references can change how it reads.
            let raw = state.records.record(key)
            let targets = Record.references.compactMap { reference in
                referencedID(raw?.fields[reference.field]?.value).map { RecordKey(collection: reference.collection, id: $0) }
            }
            guard targets.contains(where: changes.keys.contains) else { return nil }
            // A record it references changed: what shows it must refresh.
            return .some(try load(state, replica: replica))
        }
        let before = fields
        let record = try load(state, replica: replica)
        return fields == before ? nil : .some(record)
    }
}

// MARK: - Settings

/// One setting's value.
struct SettingReducer: ObservationReducer {
    let key: String
    let scope: SettingScope
    private var value: FieldValue??

    init(key: String, scope: SettingScope) {
        self.key = key
        self.scope = scope
    }

    var interest: CommitInterest {
        scope == .synced ? CommitInterest(collections: [RecordKey.syncedSettings.collection])
            : CommitInterest(collections: [], localSettings: true)
    }

    mutating func load(_ state: ReplicaState, replica: Replica) throws -> FieldValue? {
        let current = state.setting(key, scope: scope)
        value = .some(current)
        return current
    }

    mutating func update(_ changes: PendingChanges, _ state: ReplicaState, replica: Replica) throws -> FieldValue?? {
        let current = state.setting(key, scope: scope)
        if case .some(let old) = value, old == current { return nil }
        value = .some(current)
        return .some(current)
    }
}

/// All settings of one scope.
struct SettingsReducer: ObservationReducer {
    let scope: SettingScope
    private var value: [String: FieldValue]?

    init(scope: SettingScope) {
        self.scope = scope
    }

    var interest: CommitInterest { SettingReducer(key: "", scope: scope).interest }

    mutating func load(_ state: ReplicaState, replica: Replica) throws -> [String: FieldValue] {
        let current = state.settings(scope: scope)
        value = current
        return current
    }

    mutating func update(_ changes: PendingChanges, _ state: ReplicaState, replica: Replica) throws -> [String: FieldValue]? {
        let current = state.settings(scope: scope)
        if current == value { return nil }
        value = current
        return current
    }
}
