import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import PeerSyncStore

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
