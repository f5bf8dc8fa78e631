@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel

extension Replicator {
    /// Carries out attachment file work on the attachment queue (never on the actor or the
    /// cooperative pool), in the order the core decided it, and reports results back to the core.
    func performAttachmentIO(_ io: AttachmentIO) {
        let storage = self.storage
        attachmentQueue.async { [weak self] in
            switch io {
            case .check(let attachments):
                let maxBytes = storage.attachmentMaxBytes(in: storage.snapshot())
                let results = attachments.map { ($0, storage.attachmentPresence($0.contentHash)) }
                Task { await self?.attachmentsChecked(results, maxBytes: maxBytes) }
            case .serve(let id, let hash, let offset, let length):
                let result = Result { try storage.readAttachment(hash, offset: offset, length: length) }
                Task { await self?.attachmentRead(id, hash, offset: offset, result: result) }
            case .write(let hash, let offset, let bytes):
                do {
                    try storage.writeAttachmentPartial(hash, offset: offset, bytes: bytes)
                } catch {
                    let detail = "\(error)"
                    Task { await self?.attachmentIOFailed(hash, detail: detail) }
                }
            case .verify(let hash):
                let result = Result { try storage.verifyAttachmentPartial(hash) }
                Task { await self?.attachmentVerified(hash, result) }
            case .promote(let hash):
                do {
                    try storage.promoteAttachmentPartial(hash)
                } catch {
                    let detail = "\(error)"
                    Task { await self?.attachmentIOFailed(hash, detail: detail) }
                }
            case .discard(let hash):
                storage.discardAttachmentPartial(hash)
            }
        }
    }

    /// Waits until the attachment file work queued so far is done (so a restarted node sees
    /// every byte this one wrote).
    func drainAttachmentQueue() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            attachmentQueue.async { continuation.resume() }
        }
    }

    private func attachmentsChecked(_ results: [(Attachment, AttachmentPresence)], maxBytes: Int64) {
        perform(core.attachmentsChecked(results, maxBytes: maxBytes, now: .now))
    }

    private func attachmentRead(_ id: SessionID, _ hash: AttachmentHash, offset: Int64,
                                result: Result<(bytes: [UInt8], total: Int64)?, any Error>) {
        perform(core.attachmentRead(id, hash, offset: offset, result: result))
    }

    private func attachmentVerified(_ hash: AttachmentHash, _ result: Result<Bool, any Error>) {
        switch result {
        case .success(let matches): perform(core.attachmentVerified(hash, matches: matches, now: .now))
        case .failure(let error):
            // Unreadable: treated as not matching (discarded and fetched again).
            perform(core.attachmentIOFailed(hash, detail: "\(error)", now: .now) + core.attachmentVerified(hash, matches: false, now: .now))
        }
    }

    private func attachmentIOFailed(_ hash: AttachmentHash, detail: String) {
        perform(core.attachmentIOFailed(hash, detail: detail, now: .now))
    }
}
