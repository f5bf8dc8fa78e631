@_spi(Engine) import PeerSyncCRDT

/// A record was asked for by ID and is not there (never written, or deleted).
package struct RecordNotFoundError: Error, Sendable, Equatable, CustomStringConvertible {
    public let key: RecordKey

    public init(key: RecordKey) { self.key = key }

    public var description: String {
        "no record \(key) (it was never saved here, or it was deleted); nothing was written"
    }
}

/// An edit that cannot be made as asked (one line saying why; nothing was written).
package struct RecordEditError: Error, Sendable, Equatable, CustomStringConvertible {
    public let description: String

    public init(_ description: String) { self.description = description }
}

/// Edits that write exactly the fields an app changed (issue 31): never a field it did not
/// touch, so a copy that is older than a teammate's edit cannot write that field's old value
/// back.
extension ReplicaState {
    /// Applies `change` to the record of `type` with `id` as it is now and writes the fields
    /// whose encoded values `change` changed, as one event. Returns the record after the change
    /// and the delta (nil if `change` changed nothing). Throws ``RecordNotFoundError`` if there
    /// is no visible record, and whatever `change` throws (then nothing is written).
    public mutating func update<R: SyncRecord>(
        _ type: R.Type, id: UUID, _ change: (inout R) throws -> Void
    ) throws -> (record: R, delta: RecordMap?) {
        guard var record = try fetch(type, id: id) else { throw RecordNotFoundError(key: RecordKey(collection: R.collection, id: id)) }
        let before = try Self.fields(of: record)
        try change(&record)
        guard record.id == id else {
            throw RecordEditError("update(\(R.self).self, id:) cannot change a record's id; nothing was written")
        }
        let delta = try writeFields(changedFrom: before, to: try Self.fields(of: record), of: record.recordKey)
        return (record, delta)
    }

    /// Writes the fields in which `record` differs from `original` — the copy the app read and
    /// then edited — and only those, as one event. A field someone else changed since
    /// `original` was read keeps their value unless the app changed it too. Throws
    /// ``RecordNotFoundError`` if the record is not visible any more (deleted since it was
    /// read: nothing is revived by an edit).
    public mutating func save<R: SyncRecord>(_ record: R, editedFrom original: R) throws -> RecordMap? {
        guard original.id == record.id else {
            throw RecordEditError("save(_:editedFrom:) needs the same record (the same id) before and after the edit; nothing was written")
        }
        guard contains(record.recordKey) else { throw RecordNotFoundError(key: record.recordKey) }
        return try writeFields(changedFrom: try Self.fields(of: original), to: try Self.fields(of: record), of: record.recordKey)
    }

    /// The fields ``save(_:)`` would write for `record` now (nil: none), as encoded.
    public func fieldsSaveWouldWrite<R: SyncRecord>(_ record: R) throws -> [String: FieldValue]? {
        try changedFields(Self.fields(of: record), of: record.recordKey, references: R.references)
    }

    /// `record`'s fields as stored (without its `id`).
    static func fields<R: SyncRecord>(of record: R) throws -> [String: FieldValue] {
        var fields = try FieldEncoder().encodeFields(record)
        fields["id"] = nil
        return fields
    }

    /// Writes the fields of `after` whose values differ from `before` and from what is stored.
    private mutating func writeFields(changedFrom before: [String: FieldValue], to after: [String: FieldValue],
                                      of key: RecordKey) throws -> RecordMap? {
        let stored = records.record(key)?.values ?? [:]
        let edited = after.filter { name, value in before[name] != value && stored[name] != value }
        guard !edited.isEmpty else { return nil }
        return try checkedWrite(edited, to: key)
    }
}
