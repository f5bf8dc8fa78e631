import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel

/// The writes of one ``Replica/batch(_:)``: they commit together in one SQLite transaction and
/// reach peers as one delta, or — if the body throws — not at all.
///
/// Reads through the batch see its own earlier writes. Use it only inside the closure it is
/// given; afterwards every method throws ``ReplicaError/batchClosed``. Its methods throw
/// ``ReplicaError/invalidRecord(_:)`` for a record over a bound or one that does not decode as
/// its type.
public final class ReplicaBatch {
    private var state: ReplicaState
    private var delta: RecordMap?
    private var isOpen = true
    private let replica: Replica
    /// Number of writes that changed something.
    public private(set) var changeCount = 0

    fileprivate init(state: ReplicaState, replica: Replica) {
        self.state = state
        self.replica = replica
    }

    private func check() throws(ReplicaError) {
        guard isOpen else { throw .batchClosed }
    }

    private func add(_ change: RecordMap?) {
        guard let change else { return }
        changeCount += 1
        if delta == nil { delta = change } else { delta!.merge(change) }
    }

    /// Saves `record` (creating or updating it; only changed fields are written). Like
    /// ``Replica/save(_:)``, refuses a copy read before another device changed a field it would
    /// write (``ReplicaError/staleCopy(_:)``).
    public func save<Record: SyncRecord>(_ record: Record) throws(ReplicaError) {
        try check()
        let replica = self.replica
        try ReplicaError.wrapping(otherwise: ReplicaError.invalidRecord) {
            let now = state
            try Replica.refuseStaleCopy(record, in: now, ledger: replica.appSupport.reads, names: { replica.writerName(of: $0, in: now) })
        }
        add(try ReplicaError.wrapping(otherwise: ReplicaError.invalidRecord) { try state.save(record) })
    }

    /// Writes the fields in which `record` differs from `original` (``Replica/save(_:editedFrom:)``).
    public func save<Record: SyncRecord>(_ record: Record, editedFrom original: Record) throws(ReplicaError) {
        try check()
        add(try ReplicaError.wrapping(otherwise: ReplicaError.invalidRecord) { try state.save(record, editedFrom: original) })
    }

    /// Changes the record and writes exactly the fields `change` changed (``Replica/update(_:id:_:)``).
    @discardableResult
    public func update<Record: SyncRecord>(_ type: Record.Type, id: UUID, _ change: (inout Record) -> Void) throws(ReplicaError) -> Record {
        try check()
        let (record, delta) = try ReplicaError.wrapping(otherwise: ReplicaError.invalidRecord) { try state.update(type, id: id, change) }
        add(delta)
        return record
    }

    /// Deletes the record of `type` with `id`. Returns false if there was no such record.
    @discardableResult
    public func delete<Record: SyncRecord>(_ type: Record.Type, id: UUID) throws(ReplicaError) -> Bool {
        try check()
        let change = state.delete(type, id: id)
        add(change)
        return change != nil
    }

    /// Deletes `record`. Returns false if it did not exist.
    @discardableResult
    public func delete<Record: SyncRecord>(_ record: Record) throws(ReplicaError) -> Bool {
        try delete(Record.self, id: record.id)
    }

    /// Sets (or with nil, unsets) a setting.
    public func setSetting(_ key: String, to value: FieldValue?, scope: SettingScope) throws(ReplicaError) {
        try check()
        add(state.setSetting(key, to: value, scope: scope))
    }

    /// The record of `type` with `id` as the batch has it so far.
    public func fetch<Record: SyncRecord>(_ type: Record.Type, id: UUID) throws(ReplicaError) -> Record? {
        try check()
        return try ReplicaError.wrapping(otherwise: ReplicaError.invalidRecord) { try state.fetch(type, id: id) }
    }

    /// All records of `type` as the batch has them so far.
    public func fetchAll<Record: SyncRecord>(_ type: Record.Type) throws(ReplicaError) -> [Record] {
        try check()
        return try ReplicaError.wrapping(otherwise: ReplicaError.invalidRecord) { try state.fetchAll(type) }
    }

    /// Moves the state in, runs `body`, and moves the state back out (without copying it).
    fileprivate static func run<T>(_ state: inout ReplicaState, replica: Replica, _ body: (ReplicaBatch) throws -> T) throws -> (T, RecordMap?) {
        var taken = ReplicaState(replicaID: state.replicaID, name: state.name)
        swap(&taken, &state)
        let batch = ReplicaBatch(state: taken, replica: replica)
        defer {
            batch.isOpen = false
            swap(&batch.state, &state)
        }
        let result = try body(batch)
        return (result, batch.delta)
    }
}

extension Replica {
    /// Runs several saves, deletes and setting changes as one commit: one SQLite transaction
    /// and one delta to peers (the writes' deltas joined). If `body` throws, nothing is written
    /// and the error comes out of `batch` as it was thrown (so `batch` itself throws untyped:
    /// the body's own errors, the batch's ``ReplicaError``s, or a ``ReplicaError`` of the
    /// commit). Returns what `body` returns.
    ///
    /// ```swift
    /// try await replica.batch { b in
    ///     for book in imported { try b.save(book) }
    ///     try b.delete(Book.self, id: duplicate)
    /// }
    /// ```
    ///
    /// `body` and the transaction run on the caller's actor (so the closure may use its state;
    /// from the main actor, a large import blocks the UI while it commits: run those from a
    /// background task). Live observations see the whole batch at once, never part of it.
    @discardableResult
    public nonisolated(nonsending) func batch<T>(_ body: (ReplicaBatch) throws -> T) async throws -> T {
        var result: T?
        let delta = try store.write { state in
            let (value, delta) = try ReplicaBatch.run(&state, replica: self, body)
            result = value
            return delta
        }
        if delta != nil { scheduleCompaction() }  // it reaches peers through the commit feed
        return result!
    }
}
