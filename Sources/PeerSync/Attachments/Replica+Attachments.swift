import Dispatch
import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import PeerSyncStore

extension SettingKey {
    /// Synced: the largest attachment, in bytes, a replica of the group stores or fetches
    /// (an integer; default ``Replica/defaultAttachmentMaxBytes``, 64 MiB).
    public static let attachmentMaxBytes = "attachmentMaxBytes"
}

/// Whether an attachment's bytes can be read on this device.
public enum AttachmentAvailability: Sendable, Equatable {
    /// The complete, verified bytes are here.
    case available(URL)
    /// Part of the bytes arrived from a peer; the rest is on its way (or will be, when a peer
    /// that has them connects).
    case downloading(receivedBytes: Int64, totalBytes: Int64)
    /// None of the bytes are here yet.
    case notYetAvailable
}

extension Replica {
    /// The size bound when the synced setting ``SettingKey/attachmentMaxBytes`` is not set: 64 MiB.
    public static let defaultAttachmentMaxBytes: Int64 = 64 << 20

    /// The largest attachment this replica stores or fetches, from the synced setting
    /// ``SettingKey/attachmentMaxBytes`` (64 MiB when unset).
    public nonisolated var attachmentMaxBytes: Int64 {
        if case .int(let bytes)? = setting(SettingKey.attachmentMaxBytes, scope: .synced), bytes > 0 { return bytes }
        return Self.defaultAttachmentMaxBytes
    }

    /// The content-addressed attachment directory of this replica (`DIR/attachments`), for the
    /// sync layer that serves and fetches bytes.
    package nonisolated var attachmentStore: AttachmentStore { appSupport.attachments(self).files }

    /// Stores `data` beside the replica and returns the ``Attachment`` to put in a record.
    /// The same bytes are stored once. Throws ``ReplicaError/attachment(_:)`` over
    /// ``attachmentMaxBytes``. The bytes are on disk (fsync'd) when it returns.
    ///
    /// ```swift
    /// let cover = try await replica.addAttachment(jpeg, mediaType: "image/jpeg")
    /// try await replica.save(Book(id: UUID(), title: "Dune", cover: cover))
    /// ```
    ///
    /// Save the record that references it within ``attachmentPurgeGracePeriod`` (10 minutes by
    /// default): bytes no live record references are purged after that.
    public nonisolated func addAttachment(_ data: Data, mediaType: String = "application/octet-stream") async throws(ReplicaError) -> Attachment {
        let limit = attachmentMaxBytes
        return try await ReplicaError.wrapping(otherwise: ReplicaError.attachment) {
            try await adding { try $0.add(data, mediaType: mediaType, maxBytes: limit) }
        }
    }

    /// Copies the file at `url` beside the replica (streaming: never all in memory) and returns
    /// its ``Attachment``. The media type is guessed from the file extension unless given.
    public nonisolated func addAttachment(contentsOf url: URL, mediaType: String? = nil) async throws(ReplicaError) -> Attachment {
        let limit = attachmentMaxBytes
        let type = mediaType ?? Self.mediaType(forExtension: url.pathExtension)
        return try await ReplicaError.wrapping(otherwise: ReplicaError.attachment) {
            try await adding { try $0.add(contentsOf: url, mediaType: type, maxBytes: limit) }
        }
    }

    /// Runs `add` on the file queue and tells the collector the bytes are new (they go if no
    /// record references them within the grace period).
    private nonisolated func adding(_ add: @escaping @Sendable (AttachmentStore) throws -> Attachment) async throws -> Attachment {
        let collector = appSupport.attachments(self)
        let files = collector.files
        let attachment = try await onFileQueue { try add(files) }
        collector.added(attachment.contentHash)
        store.commits.publishAttachmentsChanged()
        return attachment
    }

    /// Whether the bytes of `attachment` are here, arriving (with progress) or not here yet,
    /// now and whenever that changes — for a placeholder that turns into the photo by itself:
    ///
    /// ```swift
    /// for try await availability in replica.observeAvailability(of: photo) {
    ///     if case .available(let url) = availability { show(url) }
    /// }
    /// ```
    public nonisolated func observeAvailability(of attachment: Attachment) -> ReplicaObservation<AttachmentAvailability> {
        ReplicaObservation(replica: self) { AvailabilityReducer(attachment: attachment) }
    }

    /// The bytes of `attachment`, or nil if they have not arrived on this device yet.
    public nonisolated func attachmentData(for attachment: Attachment) async throws(ReplicaError) -> Data? {
        let files = attachmentStore
        return try await ReplicaError.wrapping(otherwise: ReplicaError.attachment) {
            try await onFileQueue { try files.data(for: attachment.contentHash) }
        }
    }

    /// The file holding the bytes of `attachment` (read-only: never modify it), or nil if they
    /// have not arrived yet.
    public nonisolated func attachmentURL(for attachment: Attachment) -> URL? {
        let files = attachmentStore
        guard files.contains(attachment.contentHash) else { return nil }
        return URL(fileURLWithPath: files.path(for: attachment.contentHash))
    }

    /// Whether the bytes of `attachment` are here, arriving, or not here yet.
    public nonisolated func attachmentAvailability(for attachment: Attachment) -> AttachmentAvailability {
        if let url = attachmentURL(for: attachment) { return .available(url) }
        if let received = attachmentStore.partialSize(of: attachment.contentHash) {
            return .downloading(receivedBytes: received, totalBytes: attachment.byteCount)
        }
        return .notYetAvailable
    }

    /// Attachments that live records reference but whose bytes are not here: what the sync
    /// layer should fetch (``AttachmentTransfer``'s `.referenced` events).
    public nonisolated func missingAttachments() -> [Attachment] {
        let collector = appSupport.attachments(self)
        return collector.referencedAttachments().filter { !collector.files.contains($0.contentHash) }
    }

    /// How long a file that no live record references is kept after it was added or last
    /// written (10 minutes by default), so an attachment added just before the record that
    /// uses it is saved is not purged in between. Applies to purges after commits and to
    /// ``purgeAttachments(keepingNewerThan:)`` without an argument.
    public nonisolated var attachmentPurgeGracePeriod: Duration {
        appSupport.attachments(self).gracePeriod
    }

    /// Sets ``attachmentPurgeGracePeriod``.
    public nonisolated func setAttachmentPurgeGracePeriod(_ period: Duration) {
        appSupport.attachments(self).gracePeriod = period
    }

    /// Deletes the bytes of every attachment no visible record references (complete files,
    /// interrupted transfers and left-over temporary files), except those written within
    /// `grace` (default ``attachmentPurgeGracePeriod``). Returns the hashes deleted.
    ///
    /// This also runs by itself, cheaply, after each commit that removes the last reference to
    /// an attachment. A deleted record that comes back (an edit concurrent with its deletion)
    /// gets its bytes from a peer that still has them, or from the app adding them again.
    @discardableResult
    public nonisolated func purgeAttachments(keepingNewerThan grace: Duration? = nil) async throws(ReplicaError) -> [AttachmentHash] {
        let collector = appSupport.attachments(self)
        let grace = grace ?? collector.gracePeriod
        return try await ReplicaError.wrapping(otherwise: ReplicaError.attachment) {
            try await onFileQueue { collector.purge(olderThan: grace) }
        }
    }

    /// A media type for common file extensions; `application/octet-stream` otherwise.
    static func mediaType(forExtension ext: String) -> String {
        switch ext.lowercased() {
        case "jpg", "jpeg": "image/jpeg"
        case "png": "image/png"
        case "heic": "image/heic"
        case "gif": "image/gif"
        case "webp": "image/webp"
        case "pdf": "application/pdf"
        case "m4a": "audio/mp4"
        case "mp3": "audio/mpeg"
        case "wav": "audio/wav"
        case "mp4", "m4v": "video/mp4"
        case "mov": "video/quicktime"
        case "txt": "text/plain"
        case "json": "application/json"
        default: "application/octet-stream"
        }
    }
}

/// Runs blocking file work on a Dispatch queue, off Swift's cooperative pool.
private func onFileQueue<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        DispatchQueue.global(qos: .utility).async {
            continuation.resume(with: Result { try body() })
        }
    }
}

/// One attachment's availability, read again whenever attachment files change.
struct AvailabilityReducer: ObservationReducer {
    let attachment: Attachment
    private var value: AttachmentAvailability?

    init(attachment: Attachment) {
        self.attachment = attachment
    }

    var interest: CommitInterest { CommitInterest(collections: [], attachments: true) }

    mutating func load(_ state: ReplicaState, replica: Replica) throws -> AttachmentAvailability {
        let now = replica.attachmentAvailability(for: attachment)
        value = now
        return now
    }

    mutating func update(_ changes: PendingChanges, _ state: ReplicaState, replica: Replica) throws -> AttachmentAvailability? {
        let now = replica.attachmentAvailability(for: attachment)
        if now == value { return nil }
        value = now
        return now
    }
}
