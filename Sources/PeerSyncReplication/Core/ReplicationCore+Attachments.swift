@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import PeerSyncWire

/// File work for attachments, carried out by the shell on one serial queue, in the order given
/// (so a range is written before the file is verified, and verified before it is promoted).
enum AttachmentIO: Sendable, Equatable {
    /// Which of these referenced attachments are stored or partly here: report
    /// ``ReplicationCore/attachmentsChecked(_:maxBytes:now:)``.
    case check([Attachment])
    /// Read a range of a stored attachment for a peer: report
    /// ``ReplicationCore/attachmentRead(_:_:offset:result:)``.
    case serve(SessionID, AttachmentHash, offset: Int64, length: Int)
    /// Write received bytes into the partial file (a failure is reported with
    /// ``ReplicationCore/attachmentIOFailed(_:detail:now:)``).
    case write(AttachmentHash, offset: Int64, bytes: [UInt8])
    /// Hash the complete partial file: report ``ReplicationCore/attachmentVerified(_:matches:now:)``.
    case verify(AttachmentHash)
    case promote(AttachmentHash)
    case discard(AttachmentHash)
}

/// The attachment half of the replication core: which bytes to fetch from whom
/// (``AttachmentTransfer``, the pure decisions), requests waiting to be answered, and frames
/// queued per session. Attachment messages (types 13–15) go only to peers whose hello announced
/// ``HelloFeatures/attachments``.
struct AttachmentCoreState {
    var transfer: AttachmentTransfer
    /// Attachments already checked against the disk (not checked again).
    var known: Set<AttachmentHash> = []
    /// Whether the whole state was scanned for references (once, when the first peer is admitted).
    var scanned = false
    /// The outstanding request per attachment: to whom, and since when (nil: since the next tick).
    var requested: [AttachmentHash: (peer: ReplicaID, since: MonotonicInstant?)] = [:]
    /// Encoded attachment frames waiting for each session's writer.
    var frames: [SessionID: [[UInt8]]] = [:]
    /// Range reads in progress for each session's peer.
    var serving: [SessionID: Int] = [:]
    /// Payload bytes of `attachmentData` messages sent and received (over every session).
    var bytesSent = 0
    var bytesReceived = 0

    init(limits: SyncLimits) {
        let range = min(limits.attachmentRangeBytes, Int(AttachmentWireLimits.maxRangeBytes),
                        limits.maxFrameBytes - AttachmentWireLimits.dataFrameOverhead)
        // The size bound is applied when references are checked (it is a synced setting).
        transfer = AttachmentTransfer(configuration: .init(rangeBytes: Int64(max(1, range)), maxAttachmentBytes: .max))
    }
}

extension ReplicationCore {
    // MARK: - Inbound

    /// A peer asks for a range of an attachment (its session is established: the machine's rules).
    mutating func attachmentRequested(_ id: SessionID, _ request: AttachmentRequestBody) -> [Action] {
        guard let maxFrame = sessions[id]?.link?.maxFrame, let hash = AttachmentHash(bytes: request.hash) else { return [] }
        guard attachmentState.serving[id, default: 0] < settings.limits.attachmentServesPerSession else {
            queue(Frame.encode(type: AttachmentWireLimits.unavailableKind, body: encodeAttachmentUnavailable(hash: request.hash)), to: id)
            return [.wake(id)]
        }
        attachmentState.serving[id, default: 0] += 1
        // The answer must fit the peer's frames.
        let length = min(Int(request.length), maxFrame - AttachmentWireLimits.dataFrameOverhead)
        return [.attachmentIO(.serve(id, hash, offset: Int64(request.offset), length: length))]
    }

    /// Bytes of an attachment from a peer.
    mutating func attachmentDataReceived(_ id: SessionID, _ data: AttachmentDataBody) -> [Action] {
        guard let session = sessions[id], let peer = session.peer?.replicaID, let hash = AttachmentHash(bytes: data.hash) else {
            return []
        }
        attachmentState.bytesReceived += data.bytes.count
        let asked = attachmentState.requested[hash]
        if asked?.peer == peer { attachmentState.requested[hash] = nil }
        let actions = transferHandle(.received(from: peer, hash, offset: Int64(data.offset), total: Int64(data.total), bytes: data.bytes))
        let stored = actions.contains { if case .attachmentIO(.write(hash, _, _)) = $0 { true } else { false } }
        guard stored else {
            return [.log(CoreLog(.warning, "attachment bytes refused: not the range asked for, or not the attachment's size",
                                 sessionMetadata(session, ["attachment.hash": hash.hex, "attachment.offset": "\(data.offset)",
                                                           "attachment.bytes": "\(data.bytes.count)",
                                                           "attachment.total": "\(data.total)"])))] + actions
        }
        return actions
    }

    /// A peer does not have an attachment this side asked it for.
    mutating func attachmentUnavailable(_ id: SessionID, hash bytes: [UInt8]) -> [Action] {
        guard let peer = sessions[id]?.peer?.replicaID, let hash = AttachmentHash(bytes: bytes) else { return [] }
        if attachmentState.requested[hash]?.peer == peer { attachmentState.requested[hash] = nil }
        return transferHandle(.peerLacks(peer, hash))
    }

    // MARK: - Sessions

    /// A session was admitted: the first one scans the state for references; a peer that
    /// announced the feature becomes a source of bytes.
    mutating func attachmentPeerAdmitted(_ id: SessionID, hello: Hello, state: some ReplicaView) -> [Action] {
        guard settings.attachments else { return [] }
        var actions: [Action] = []
        if !attachmentState.scanned {
            attachmentState.scanned = true
            var found: Set<Attachment> = []
            for records in state.records.collections.values {
                for record in records.values where record.isVisible { Attachment.collectReferenced(in: record, into: &found) }
            }
            actions += check(found)
        }
        guard hello.features.contains(.attachments) else { return actions }
        return actions + transferHandle(.peerConnected(hello.replicaID))
    }

    /// A session's transport ended (before the core forgets it): its queued frames go, and if
    /// it was the peer's established session, the peer stops being a source.
    mutating func attachmentSessionEnded(_ id: SessionID, _ session: PeerSession) -> [Action] {
        attachmentState.frames[id] = nil
        attachmentState.serving[id] = nil
        guard settings.attachments, let peer = session.peer?.replicaID, established[peer] == id,
              session.peer?.features.contains(.attachments) == true else { return [] }
        attachmentState.requested = attachmentState.requested.filter { $0.value.peer != peer }
        return transferHandle(.peerDisconnected(peer))
    }

    // MARK: - References

    /// Records changed (a commit of peers' deltas, a local change): fetch what the visible ones
    /// reference and this node has not looked at yet.
    mutating func attachmentsReferenced(in keys: some Sequence<RecordKey>, state: some ReplicaView) -> [Action] {
        guard settings.attachments, attachmentState.scanned else { return [] }
        var found: Set<Attachment> = []
        for key in keys {
            guard let record = state.records.record(key), record.isVisible else { continue }
            Attachment.collectReferenced(in: record, into: &found)
        }
        return check(found)
    }

    /// The whole state changed (reloaded from disk): look at every reference again.
    mutating func attachmentsRescan(state: some ReplicaView) -> [Action] {
        guard settings.attachments, attachmentState.scanned else { return [] }
        var found: Set<Attachment> = []
        for (_, record) in state.records.allRecords where record.isVisible {
            found.formUnion(Attachment.referenced(in: record.values))
        }
        return check(found)
    }

    private mutating func check(_ found: Set<Attachment>) -> [Action] {
        let new = found.filter { !attachmentState.known.contains($0.contentHash) }
        guard !new.isEmpty else { return [] }
        attachmentState.known.formUnion(new.map(\.contentHash))
        return [.attachmentIO(.check(new.sorted { $0.contentHash < $1.contentHash }))]
    }

    // MARK: - Results of file work

    /// What the disk holds of referenced attachments; `maxBytes` is the size bound in force.
    mutating func attachmentsChecked(_ results: [(Attachment, AttachmentPresence)], maxBytes: Int64, now: MonotonicInstant) -> [Action] {
        var actions: [Action] = []
        for (attachment, presence) in results {
            let hash = attachment.contentHash
            switch presence {
            case .stored:
                actions += transferHandle(.availableLocally(hash))
            case .partial(let bytes):
                guard attachment.byteCount <= maxBytes else {
                    actions.append(.log(CoreLog(.warning, "attachment not fetched: it is over the size bound; raise the synced setting attachmentMaxBytes to fetch it", [
                        "attachment.hash": hash.hex, "attachment.bytes": "\(attachment.byteCount)", "limit.bytes": "\(maxBytes)",
                    ])))
                    continue
                }
                if bytes > 0 { actions += transferHandle(.partialOnDisk(hash, bytes: bytes)) }
                actions += transferHandle(.referenced(attachment))
                if bytes > 0 {
                    actions.append(.log(CoreLog(.debug, "resuming an attachment transfer", [
                        "attachment.hash": hash.hex, "attachment.stored": "\(bytes)", "attachment.bytes": "\(attachment.byteCount)",
                    ])))
                }
            }
        }
        return actions
    }

    /// A range read for session `id` finished: the bytes and the attachment's size, nil if it
    /// is not stored here, or the error.
    mutating func attachmentRead(_ id: SessionID, _ hash: AttachmentHash, offset: Int64,
                                 result: Result<(bytes: [UInt8], total: Int64)?, any Error>) -> [Action] {
        if let serving = attachmentState.serving[id] { attachmentState.serving[id] = max(0, serving - 1) }
        guard let session = sessions[id], session.phase == .established else { return [] }
        var actions: [Action] = []
        let frame: [UInt8]
        switch result {
        case .success(let read?) where offset < read.total && !read.bytes.isEmpty && offset + Int64(read.bytes.count) <= read.total:
            frame = Frame.encode(type: AttachmentWireLimits.dataKind, body: encodeAttachmentData(
                AttachmentDataBody(hash: hash.bytes, offset: UInt64(offset), total: UInt64(read.total), bytes: read.bytes)))
            attachmentState.bytesSent += read.bytes.count
        case .success:
            frame = Frame.encode(type: AttachmentWireLimits.unavailableKind, body: encodeAttachmentUnavailable(hash: hash.bytes))
        case .failure(let error):
            actions.append(.log(CoreLog(.warning, "cannot read an attachment a peer asked for",
                                        sessionMetadata(session, ["attachment.hash": hash.hex, "error": "\(error)"]))))
            frame = Frame.encode(type: AttachmentWireLimits.unavailableKind, body: encodeAttachmentUnavailable(hash: hash.bytes))
        }
        queue(frame, to: id)
        return actions + [.wake(id)]
    }

    /// The SHA-256 of a complete partial file was computed.
    mutating func attachmentVerified(_ hash: AttachmentHash, matches: Bool, now: MonotonicInstant) -> [Action] {
        let line = matches
            ? CoreLog(.debug, "attachment received and verified", ["attachment.hash": hash.hex])
            : CoreLog(.warning, "attachment bytes from a peer do not match their hash; discarded, nothing stored", ["attachment.hash": hash.hex])
        return [.log(line)] + transferHandle(.verified(hash, matches: matches))
    }

    /// File work for `hash` failed (a write, a verification or a promotion).
    mutating func attachmentIOFailed(_ hash: AttachmentHash, detail: String, now: MonotonicInstant) -> [Action] {
        var actions: [Action] = [.log(CoreLog(.error, "cannot store attachment bytes", ["attachment.hash": hash.hex, "error": detail]))]
        if let asked = attachmentState.requested[hash] {
            attachmentState.requested[hash] = nil
            actions += transferHandle(.requestFailed(asked.peer, hash))
        }
        return actions
    }

    // MARK: - Timer and output

    /// Requests unanswered for ``SyncTiming/attachmentRequestTimeout`` are given up (asked again).
    mutating func attachmentTick(now: MonotonicInstant) -> [Action] {
        guard settings.attachments, !attachmentState.requested.isEmpty else { return [] }
        var actions: [Action] = []
        for (hash, asked) in attachmentState.requested.sorted(by: { $0.key < $1.key }) {
            guard let since = asked.since else {
                attachmentState.requested[hash]!.since = now
                continue
            }
            guard now - since >= settings.timing.attachmentRequestTimeout else { continue }
            attachmentState.requested[hash] = nil
            actions.append(.log(CoreLog(.info, "attachment request unanswered; asking again",
                                        ["attachment.hash": hash.hex, "peer.id": asked.peer.shortDescription])))
            actions += transferHandle(.requestFailed(asked.peer, hash))
        }
        return actions
    }

    /// Appends queued attachment frames to what the session's writer gets (after the sync
    /// messages: records go first), up to about `budget` bytes, at least one frame.
    mutating func appendAttachmentFrames(_ id: SessionID, to batch: OutboundBatch?, budget: Int, now: MonotonicInstant) -> OutboundBatch? {
        guard var pending = attachmentState.frames[id], !pending.isEmpty, sessions[id]?.phase == .established,
              batch?.closeAfter != true else { return batch }
        var bytes = batch?.bytes ?? []
        var added = 0
        var addedBytes = 0
        while let next = pending.first, added == 0 || bytes.count + next.count <= budget {
            bytes += next
            pending.removeFirst()
            added += 1
            addedBytes += next.count
        }
        attachmentState.frames[id] = pending.isEmpty ? nil : pending
        sessions[id]?.lastSent = now
        sessions[id]?.framesSent += added
        sessions[id]?.bytesSent += addedBytes
        return OutboundBatch(bytes: bytes, frames: (batch?.frames ?? 0) + added, closeAfter: false)
    }

    // MARK: - The transfer machine

    private mutating func queue(_ frame: [UInt8], to id: SessionID) {
        attachmentState.frames[id, default: []].append(frame)
    }

    /// Feeds the pure transfer machine and turns its actions into the core's.
    private mutating func transferHandle(_ event: AttachmentTransfer.Event) -> [Action] {
        var actions: [Action] = []
        for action in attachmentState.transfer.handle(event) {
            switch action {
            case .request(let peer, let hash, let offset, let length):
                // The timeout starts at the next tick (the core has no clock of its own here).
                attachmentState.requested[hash] = (peer, nil)
                guard let id = established[peer] else { continue }  // gone meanwhile: the timeout asks again
                queue(Frame.encode(type: AttachmentWireLimits.requestKind, body: encodeAttachmentRequest(
                    AttachmentRequestBody(hash: hash.bytes, offset: UInt64(offset), length: UInt64(length)))), to: id)
                actions.append(.wake(id))
            case .writePartial(let hash, let offset, let bytes):
                actions.append(.attachmentIO(.write(hash, offset: offset, bytes: bytes)))
            case .verifyPartial(let hash):
                attachmentState.requested[hash] = nil
                actions.append(.attachmentIO(.verify(hash)))
            case .promotePartial(let hash):
                actions.append(.attachmentIO(.promote(hash)))
            case .discardPartial(let hash):
                actions.append(.attachmentIO(.discard(hash)))
            }
        }
        return actions
    }
}
