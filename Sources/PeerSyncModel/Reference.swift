@_spi(Engine) import PeerSyncCRDT

/// A typed link to a record of another collection, for use as a property of a ``SyncRecord``.
///
/// It encodes as the target's UUID (a ``FieldValue/uuid(_:)`` field), so a `Reference<Location>`
/// property is wire-compatible with a plain `UUID` one such as ``ShiftType/locationID``: the
/// two can be swapped between app versions without a migration.
///
/// ```swift
/// struct Book: SyncRecord {
///     static let collection = "books"
///     static let references = [RecordReference(field: "shelf", to: Shelf.self)]
///     var id: UUID
///     var title: String
///     var shelf: Reference<Shelf>?
/// }
/// let shelf = try replica.resolve(book.shelf)   // Shelf? — nil if it was deleted
/// ```
///
/// Dangling references: declare the field in ``SyncRecord/references`` and a reference to a
/// record that does not exist (never arrived, or was deleted) reads as `nil` — the rule of
/// `ReplicaState.fetch`. An undeclared `Reference` keeps its UUID; resolving it still gives nil.
/// Nothing is ever written on the referring record: deleting a target neither cascades nor
/// creates a conflict, and saving the referring record after an edit of another property does
/// not write the `nil` it read (``ReplicaState/save(_:)``), so it points at the target again if
/// the target comes back. Setting another reference, or `nil` while the target exists, is written.
public struct Reference<Target: SyncRecord>: Hashable, Sendable, Codable, CustomStringConvertible {
    /// The target record's ID.
    public let id: UUID

    /// A reference to the record of `Target` with `id`.
    public init(_ id: UUID) {
        self.id = id
    }

    /// A reference to `record`.
    public init(_ record: Target) {
        id = record.id
    }

    /// The target's key in the replica's state.
    public var key: RecordKey { RecordKey(collection: Target.collection, id: id) }

    /// Decodes the target's UUID (a UUID value, or its string form).
    public init(from decoder: any Decoder) throws {
        id = try decoder.singleValueContainer().decode(UUID.self)
    }

    /// Encodes the target's UUID, as a plain `UUID` property would.
    public func encode(to encoder: any Encoder) throws {
        var container = encoder.singleValueContainer()
        try container.encode(id)
    }

    /// `collection/UUID` of the target.
    public var description: String { key.description }
}

extension RecordReference {
    /// A field that refers to records of `target`'s collection.
    public init<Target: SyncRecord>(field: String, to target: Target.Type) {
        self.init(field: field, collection: Target.collection)
    }
}
