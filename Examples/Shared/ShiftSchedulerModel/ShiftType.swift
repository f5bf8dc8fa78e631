import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel

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

extension ShiftType {
    /// The longest valid ``duration``: 366 days (31,622,400 seconds). A longer "shift" is a
    /// typo or damage; the import and the CLI refuse it.
    public static let maximumDuration: TimeInterval = 366 * 86_400

    /// Why `seconds` is not a valid ``duration`` (not a number, infinite, negative, or over
    /// ``maximumDuration``), or nil if it is one. A stored shift type can still hold an
    /// invalid duration (written by another program, or synced from a peer that did not
    /// check): readers show it as invalid instead of computing with it.
    public static func durationViolation(_ seconds: Double) -> String? {
        if seconds.isNaN { return "not a number" }
        if seconds.isInfinite { return "infinite" }
        if seconds < 0 { return "negative" }
        if seconds > maximumDuration { return "over the maximum of \(Int(maximumDuration)) seconds (366 days)" }
        return nil
    }

    /// Whether ``duration`` is valid (see ``durationViolation(_:)``).
    public var hasValidDuration: Bool { Self.durationViolation(duration) == nil }
}
