/// What a group of devices must hold after a month of edits (issue 29): every edit the test
/// makes is an operation here, with the set of earlier operations its device knew when it made
/// it. "Knew" is a lower bound of what the device really held (it grows only at the moments the
/// test waits for a set of devices to converge), so `a ∈ b.knew` proves `a` happened before `b`.
/// From that, pure functions say which records must be visible and which values each field may
/// hold. No sockets, no clock.
///
/// Semantics (docs/ARCHITECTURE.md, "Records"): a record is visible iff some write to it (add or
/// set) was not seen by any delete of it (add-wins; a concurrent edit revives it whole); a field
/// holds the value of one of its maximal writes (last-writer-wins among writes no later write
/// had seen; when several are maximal, the race, any one of them, the same on every device).
struct MonthModel: Sendable {
    enum Kind: String, Sendable { case location, shiftType }

    enum Field: String, Sendable, CaseIterable, Comparable {
        case name, address, symbol, title, description, duration, locationID
        static func < (a: Field, b: Field) -> Bool { a.rawValue < b.rawValue }
        static func of(_ kind: Kind) -> [Field] {
            kind == .location ? [.name, .address] : [.symbol, .title, .description, .duration, .locationID]
        }
    }

    enum Value: Hashable, Sendable, CustomStringConvertible {
        case text(String)
        case seconds(Int)
        /// A location, by the model's record number; nil: no location.
        case reference(Int?)

        var description: String {
            switch self {
            case .text(let text): "\"\(text)\""
            case .seconds(let seconds): "\(seconds)s"
            case .reference(let record): record.map { "→L\($0)" } ?? "null"
            }
        }
    }

    enum OpKind: String, Sendable { case add, set, delete }

    /// Why an operation is there, for the diff a failure prints.
    enum Note: Equatable, Sendable {
        case plain
        /// One of two writes to the same field made apart (either value may win).
        case race
        /// Made offline on a restored device, after restore number `n` and before its first session.
        case afterRestore(Int)
        /// Made by the removed device after its removal: must land nowhere.
        case afterRemoval
        /// The deliberate edit concurrent with a delete (the record must come back whole).
        case revive
    }

    struct Op: Sendable {
        var index: Int
        var device: Int
        var day: Int
        var kind: OpKind
        var record: Int
        var fields: [Field: Value]
        /// The operations the device knew when it made this one.
        var knew: Set<Int>
        var note: Note

        var label: String {
            let notes: String = switch note {
            case .plain: ""
            case .race: ", racing"
            case .afterRestore(let n): ", offline after restore #\(n)"
            case .afterRemoval: ", after its removal"
            case .revive: ", concurrent with a delete"
            }
            return "\(kind.rawValue) by d\(device) on day \(day)\(notes)"
        }
    }

    struct Record: Sendable {
        var kind: Kind
        var ops: [Int] = []
    }

    private(set) var ops: [Op] = []
    private(set) var records: [Record] = []
    /// Per device, the operations it is known to hold.
    private(set) var knowledge: [Set<Int>]

    init(devices: Int) { knowledge = Array(repeating: [], count: devices) }

    // MARK: Changes

    /// A new record by `device`; returns its number.
    @discardableResult
    mutating func add(_ kind: Kind, by device: Int, day: Int, fields: [Field: Value], note: Note = .plain) -> Int {
        records.append(Record(kind: kind))
        record(.add, device: device, day: day, record: records.count - 1, fields: fields, note: note)
        return records.count - 1
    }

    @discardableResult
    mutating func set(_ record: Int, by device: Int, day: Int, fields: [Field: Value], note: Note = .plain) -> Int {
        self.record(.set, device: device, day: day, record: record, fields: fields, note: note)
    }

    @discardableResult
    mutating func delete(_ record: Int, by device: Int, day: Int, note: Note = .plain) -> Int {
        self.record(.delete, device: device, day: day, record: record, fields: [:], note: note)
    }

    @discardableResult
    private mutating func record(_ kind: OpKind, device: Int, day: Int, record: Int, fields: [Field: Value], note: Note) -> Int {
        let index = ops.count
        ops.append(Op(index: index, device: device, day: day, kind: kind, record: record, fields: fields,
                      knew: knowledge[device], note: note))
        records[record].ops.append(index)
        knowledge[device].insert(index)
        return index
    }

    /// `devices` converged: each now holds what any of them held.
    mutating func sync(_ devices: some Sequence<Int>) {
        let devices = Array(devices)
        let union = devices.reduce(into: Set<Int>()) { $0.formUnion(knowledge[$1]) }
        for device in devices { knowledge[device] = union }
    }

    /// The device's store was put back to a backup that held `snapshot`.
    mutating func restore(_ device: Int, to snapshot: Set<Int>) { knowledge[device] = snapshot }

    // MARK: Questions

    /// Whether `record` is visible to a device holding `known`.
    func isVisible(_ record: Int, in known: Set<Int>) -> Bool {
        let mine = records[record].ops.filter(known.contains)
        let deletes = mine.filter { ops[$0].kind == .delete }
        return mine.contains { w in ops[w].kind != .delete && !deletes.contains { ops[$0].knew.contains(w) } }
    }

    func isVisible(_ record: Int, to device: Int) -> Bool { isVisible(record, in: knowledge[device]) }

    /// The values `field` of `record` may hold for a device holding `known`: those of the writes
    /// no other known write had seen. Empty if nothing known wrote it.
    func candidates(_ record: Int, _ field: Field, in known: Set<Int>) -> Set<Value> {
        let writes = records[record].ops.filter { known.contains($0) && ops[$0].fields[field] != nil }
        let maximal = writes.filter { w in !writes.contains { $0 != w && ops[$0].knew.contains(w) } }
        return Set(maximal.compactMap { ops[$0].fields[field] })
    }

    /// The operations behind the candidates (for the diff).
    func maximalWrites(_ record: Int, _ field: Field, in known: Set<Int>) -> [Op] {
        let writes = records[record].ops.filter { known.contains($0) && ops[$0].fields[field] != nil }
        return writes.filter { w in !writes.contains { $0 != w && ops[$0].knew.contains(w) } }.map { ops[$0] }
    }

    /// Whether some operation deleted the record (the generator never edits it afterwards).
    func isDoomed(_ record: Int) -> Bool { records[record].ops.contains { ops[$0].kind == .delete } }

    /// Whether `device` holds every operation made on `record` (so a delete is not concurrent with any edit).
    func knowsAll(of record: Int, device: Int) -> Bool { records[record].ops.allSatisfy(knowledge[device].contains) }

    /// What a device holding `known` must show: visible records and, per field, the values allowed.
    func expected(_ known: Set<Int>) -> [Int: [Field: Set<Value>]] {
        var result: [Int: [Field: Set<Value>]] = [:]
        for record in records.indices where isVisible(record, in: known) {
            var fields: [Field: Set<Value>] = [:]
            for field in Field.of(records[record].kind) {
                let values = candidates(record, field, in: known)
                if !values.isEmpty { fields[field] = values }
            }
            result[record] = fields
        }
        return result
    }
}

/// One device's records as it shows them (from `peersync export`), by the model's record numbers;
/// records the model does not know are listed by ID.
struct ObservedState: Sendable {
    var records: [Int: [MonthModel.Field: MonthModel.Value]] = [:]
    var unknown: [String] = []
}

/// The oracle's verdict for one device: every way it differs from the model.
struct Difference: Sendable, CustomStringConvertible {
    enum Problem: Sendable {
        case missing(added: String)
        case unexpected(why: String)
        case value(MonthModel.Field, expected: Set<MonthModel.Value>, actual: MonthModel.Value?, writes: String)
        case unknownRecord(String)
    }
    var device: Int
    /// "location 12", "shift type 3".
    var record: String
    var problem: Problem

    var description: String {
        switch problem {
        case .missing(let added): "d\(device): \(record) missing (\(added))"
        case .unexpected(let why): "d\(device): \(record) present but should be absent (\(why))"
        case .value(let field, let expected, let actual, let writes):
            "d\(device): \(record).\(field.rawValue) = \(actual.map(\.description) ?? "absent"), expected "
                + expected.map(\.description).sorted().joined(separator: " or ") + " (\(writes))"
        case .unknownRecord(let id): "d\(device): a record the test never wrote: \(id)"
        }
    }
}

extension MonthModel {
    /// Every way `observed` differs from what a device holding `known` must show.
    func differences(device: Int, observed: ObservedState, known: Set<Int>) -> [Difference] {
        let expected = expected(known)
        var result: [Difference] = []
        for (record, fields) in expected.sorted(by: { $0.key < $1.key }) {
            guard let actual = observed.records[record] else {
                let writes = records[record].ops.filter(known.contains).map { ops[$0].label }
                result.append(Difference(device: device, record: name(record), problem: .missing(added: writes.joined(separator: "; "))))
                continue
            }
            for (field, values) in fields.sorted(by: { $0.key < $1.key }) where !(actual[field].map(values.contains) ?? false) {
                let writes = maximalWrites(record, field, in: known).map(\.label).joined(separator: "; ")
                result.append(Difference(device: device, record: name(record),
                                         problem: .value(field, expected: values, actual: actual[field], writes: writes)))
            }
        }
        for record in observed.records.keys.sorted() where expected[record] == nil {
            result.append(Difference(device: device, record: name(record), problem: .unexpected(why: whyAbsent(record, known: known))))
        }
        result += observed.unknown.map { Difference(device: device, record: $0, problem: .unknownRecord($0)) }
        return result
    }

    func name(_ record: Int) -> String { "\(records[record].kind == .location ? "location" : "shift type") \(record)" }

    /// Why a record must not be visible to a device holding `known`.
    func whyAbsent(_ record: Int, known: Set<Int>) -> String {
        let mine = records[record].ops
        if let delete = mine.first(where: { known.contains($0) && ops[$0].kind == .delete }) {
            return "deleted: \(ops[delete].label)"
        }
        let add = ops[mine[0]]
        if add.note == .afterRemoval { return "added by the removed device after its removal, day \(add.day)" }
        return "\(add.label), a write no current device should hold"
    }
}
