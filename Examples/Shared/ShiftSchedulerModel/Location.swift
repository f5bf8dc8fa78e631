import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel

/// A place where shifts happen.
public struct Location: SyncRecord, Hashable {
    public static let collection = "locations"

    public var id: UUID
    public var name: String
    public var address: String

    public init(id: UUID = UUID(), name: String, address: String = "") {
        self.id = id
        self.name = name
        self.address = address
    }
}
