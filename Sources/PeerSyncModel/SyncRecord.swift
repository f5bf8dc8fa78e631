@_spi(Engine) import PeerSyncCRDT

/// A record type that PeerSync keeps in sync: a plain `Codable` struct with a UUID `id`.
///
/// Each coding key (other than `id`) becomes a field, merged on its own by last-writer-wins,
/// so two devices that edit different fields of one record both keep their edits. Fields a
/// newer version of the type wrote and this version does not know are kept and re-sent.
///
/// ```swift
/// struct Note: SyncRecord {
///     static let collection = "notes"
///     var id: UUID
///     var text: String
/// }
/// ```
public protocol SyncRecord: Codable, Sendable, Identifiable where ID == UUID {
    /// The collection's name, stable across app versions (it is part of the synced state).
    static var collection: String { get }
    /// Fields that hold the ID of a record in another collection. A reference to a record that
    /// does not exist (or was deleted) reads as `nil`; nothing is written, and saving the record
    /// with that `nil` leaves the stored ID as it is.
    static var references: [RecordReference] { get }
}

extension SyncRecord {
    public static var references: [RecordReference] { [] }

    /// The key of this record in the replica's state.
    public var recordKey: RecordKey { RecordKey(collection: Self.collection, id: id) }
}

/// A field that refers to a record of another collection by its UUID.
public struct RecordReference: Sendable, Hashable {
    public let field: String
    public let collection: String

    public init(field: String, collection: String) {
        self.field = field
        self.collection = collection
    }
}
