/// Names one record: its collection (e.g. `"shiftTypes"`) and its ID.
public struct RecordKey: Hashable, Comparable, Sendable, CustomStringConvertible {
    public let collection: String
    public let id: UUID

    public init(collection: String, id: UUID) {
        self.collection = collection
        self.id = id
    }

    /// The ID's 16 bytes as two words. The collection is left out: IDs are random UUIDs, so
    /// two keys sharing one are rare and `==` tells them apart; hashing the name as well, and
    /// the ID as bytes, cost more than the lookups themselves in sets of changed records.
    public func hash(into hasher: inout Hasher) {
        withUnsafeBytes(of: id.uuid) { raw in
            hasher.combine(raw.loadUnaligned(fromByteOffset: 0, as: UInt64.self))
            hasher.combine(raw.loadUnaligned(fromByteOffset: 8, as: UInt64.self))
        }
    }

    public static func < (lhs: RecordKey, rhs: RecordKey) -> Bool {
        (lhs.collection, lhs.id.uuidString) < (rhs.collection, rhs.id.uuidString)
    }

    public var description: String { "\(collection)/\(id.uuidString)" }
}

/// One field of one record: a last-writer-wins register that also remembers the event (dot)
/// that wrote it and the timestamp of the value that write replaced on its writer.
///
/// `supersedes` makes conflicts visible without vector clocks per field: a writer that had
/// seen value `v` replaced something at least as new as `v`, so if the winner's `supersedes`
/// is older than the loser's timestamp, the winner's writer never saw the loser — the two
/// writes were concurrent. (No false alarms; a concurrent loser can go unreported when its
/// winner itself replaced a third, newer concurrent value.)
package struct FieldRegister: Hashable, Sendable {
    // Declared stamp first: the synthesized `==` compares in this order, so two registers of
    // different writes differ at the first word, before any value (a string on the heap) is read.
    public let timestamp: HLCTimestamp
    /// The event that wrote this value; `dot.replica` is the writer.
    public let dot: Dot
    /// Timestamp of the value this write replaced on its writer (``HLCTimestamp/zero`` if none).
    public let supersedes: HLCTimestamp
    public let value: FieldValue

    public init(value: FieldValue, timestamp: HLCTimestamp, dot: Dot, supersedes: HLCTimestamp) {
        self.value = value
        self.timestamp = timestamp
        self.dot = dot
        self.supersedes = supersedes
    }

    /// The last-writer-wins order: (timestamp, writer).
    public var stamp: WriteStamp { WriteStamp(time: timestamp, replica: dot.replica) }

    /// Whether `self` beats `other` in last-writer-wins. Total: ties on the stamp (which honest
    /// replicas never produce for different writes) fall back to the rest of the register.
    public func wins(over other: FieldRegister) -> Bool {
        if timestamp != other.timestamp { return timestamp > other.timestamp }
        if dot.replica != other.dot.replica { return dot.replica > other.dot.replica }
        if dot.counter != other.dot.counter { return dot.counter > other.dot.counter }
        if supersedes != other.supersedes { return supersedes > other.supersedes }
        return value > other.value
    }
}

/// Whether one replica's add of a record is live: the counter of that replica's latest write
/// to the record, and, if a delete observed that write, the delete's dot.
///
/// Entries of one replica join by a total order: higher counter wins; for the same counter a
/// removed entry beats a live one; two removals keep the smaller remover. A replica's later
/// write always observed its earlier one, so keeping only the latest entry per replica loses
/// nothing: presence costs one entry per replica that ever wrote the record.
package struct PresenceEntry: Hashable, Sendable {
    public let counter: UInt64
    public let removedBy: Dot?

    public init(counter: UInt64, removedBy: Dot?) {
        self.counter = counter
        self.removedBy = removedBy
    }

    public var isLive: Bool { removedBy == nil }

    public func joined(with other: PresenceEntry) -> PresenceEntry {
        if counter != other.counter { return counter > other.counter ? self : other }
        switch (removedBy, other.removedBy) {
        case (nil, _): return other
        case (_, nil): return self
        case let (mine?, theirs?): return mine <= theirs ? self : other
        }
    }
}

/// The state of one record: its fields and its presence.
///
/// Deleting a record kills the presence entries the deleter observed but keeps the fields,
/// so an edit made concurrently with the delete (a presence entry the deleter never saw)
/// brings the record back with all its last-known fields, not just the edited one.
package struct RecordState: Hashable, Sendable {
    /// Field name → register, in name order (`String`'s `<`, the order encodings write).
    public internal(set) var fields: SortedMap<String, FieldRegister>
    /// Writer → its presence entry, in replica order.
    public internal(set) var presence: SortedMap<ReplicaID, PresenceEntry>

    public init(fields: SortedMap<String, FieldRegister> = SortedMap(), presence: SortedMap<ReplicaID, PresenceEntry> = SortedMap()) {
        self.fields = fields
        self.presence = presence
    }

    /// Whether the record exists: some presence entry is live.
    public var isVisible: Bool {
        for entry in presence.entries where entry.value.isLive { return true }
        return false
    }

    /// Field name → current value.
    public var values: [String: FieldValue] {
        var values: [String: FieldValue] = Dictionary(minimumCapacity: fields.count)
        for (name, register) in fields { values[name] = register.value }
        return values
    }

    var isEmpty: Bool { fields.isEmpty && presence.isEmpty }

    /// The newest timestamp in this record.
    public var maxTimestamp: HLCTimestamp {
        fields.values.map(\.timestamp).max() ?? .zero
    }
}
