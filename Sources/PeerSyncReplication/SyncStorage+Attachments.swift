@_spi(Engine) import PeerSyncCRDT
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
    package var storesAttachments: Bool { false }
    /// 64 MiB.
    package func attachmentMaxBytes(in state: ReplicaState) -> Int64 { 64 << 20 }
    package func attachmentPresence(_ hash: AttachmentHash) -> AttachmentPresence { .partial(bytes: 0) }
    package func readAttachment(_ hash: AttachmentHash, offset: Int64, length: Int) throws -> (bytes: [UInt8], total: Int64)? { nil }
    package func writeAttachmentPartial(_ hash: AttachmentHash, offset: Int64, bytes: [UInt8]) throws { throw AttachmentsNotStored() }
    package func verifyAttachmentPartial(_ hash: AttachmentHash) throws -> Bool { false }
    package func promoteAttachmentPartial(_ hash: AttachmentHash) throws { throw AttachmentsNotStored() }
    package func discardAttachmentPartial(_ hash: AttachmentHash) {}
}
