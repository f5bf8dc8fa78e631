import Foundation
import PeerSync

/// The app's records.
struct Shift: SyncRecord, Hashable {
    static let collection = "shifts"
    var id = UUID()
    var start: Date
    var assignee: String
}

struct Place: SyncRecord, Hashable {
    static let collection = "places"
    var id = UUID()
    var name: String
    var photo: Attachment?
}

