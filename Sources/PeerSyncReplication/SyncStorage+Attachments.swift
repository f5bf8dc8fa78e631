import PeerSyncCRDT
import PeerSyncModel

/// What a storage holds of one attachment's bytes.
package enum AttachmentPresence: Sendable, Equatable {
    /// The complete, verified bytes.
    case stored
    /// A partial file of this many bytes (an interrupted transfer); 0 if there is none.
    case partial(bytes: Int64)
}

/// Why attachment bytes cannot be written to a storage that keeps none.
package struct AttachmentsNotStored: Error, Sendable, CustomStringConvertible {
    public init() {}
    public var description: String { "this storage keeps no attachment bytes" }
}

extension SyncStorage {
    /// No attachment bytes: the node neither serves nor fetches them.
    public var storesAttachments: Bool { false }
    /// 64 MiB.
    public func attachmentMaxBytes(in state: ReplicaState) -> Int64 { 64 << 20 }
    public func attachmentPresence(_ hash: AttachmentHash) -> AttachmentPresence { .partial(bytes: 0) }
    public func readAttachment(_ hash: AttachmentHash, offset: Int64, length: Int) throws -> (bytes: [UInt8], total: Int64)? { nil }
    public func writeAttachmentPartial(_ hash: AttachmentHash, offset: Int64, bytes: [UInt8]) throws { throw AttachmentsNotStored() }
    public func verifyAttachmentPartial(_ hash: AttachmentHash) throws -> Bool { false }
    public func promoteAttachmentPartial(_ hash: AttachmentHash) throws { throw AttachmentsNotStored() }
    public func discardAttachmentPartial(_ hash: AttachmentHash) {}
}
