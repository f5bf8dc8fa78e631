import PeerSyncCRDT

/// A kind of shift in a schedule ("Early", "N" for night, …), possibly tied to a location.
public struct ShiftType: SyncRecord, Hashable {
    public static let collection = "shiftTypes"
    public static let references = [RecordReference(field: "locationID", collection: Location.collection)]

    public var id: UUID
    /// A short mark for calendars, 1–3 characters.
    public var symbol: String
    public var title: String
    public var description: String
    /// Length of the shift in seconds.
    public var duration: TimeInterval
    /// The ``Location`` this shift happens at; reads `nil` if that location was deleted.
    public var locationID: UUID?

    public init(
        id: UUID = UUID(), symbol: String, title: String, description: String = "",
        duration: TimeInterval, locationID: UUID? = nil
    ) {
        self.id = id
        self.symbol = symbol
        self.title = title
        self.description = description
        self.duration = duration
        self.locationID = locationID
    }
}
