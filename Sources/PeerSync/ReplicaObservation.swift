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
