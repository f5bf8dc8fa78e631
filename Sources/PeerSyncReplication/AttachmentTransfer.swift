@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel

/// Decides which attachment bytes to fetch, from which peer, in which ranges: lazily (only
/// attachments a live record references and whose bytes are missing here), resumably (from the
/// bytes already in the `.partial` file), verified (SHA-256 of the whole file; a mismatch
/// discards it and fetches again) and with a bounded number of requests in flight.
///
/// A pure state machine: ``handle(_:)`` takes an ``Event`` and returns the ``Action``s the
/// session shell must carry out, in order. It never touches files, sockets or clocks; the
/// shell reports what happened as further events (`.verified` after a `.verifyPartial`, a
/// timeout as `.requestFailed`).
///
/// A typical exchange for a 600 KiB attachment with 256 KiB ranges:
/// ```
/// .referenced(a)             → (nothing: no peer yet)
/// .peerConnected(p)          → .request(p, h, offset: 0, length: 262144)
/// .received(p, h, 0, …)      → .writePartial(h, 0, …), .request(p, h, offset: 262144, …)
/// .peerDisconnected(p)       → (the partial keeps 512 KiB)
/// .peerConnected(q)          → .request(q, h, offset: 524288, length: 90112)
/// .received(q, h, 524288, …) → .writePartial(…), .verifyPartial(h)
/// .verified(h, matches: true)→ .promotePartial(h)
/// ```
package struct AttachmentTransfer: Sendable {
    /// The bounds of a transfer.
    package struct Configuration: Sendable, Equatable {
        /// Bytes asked for per request (the last range of a file may be shorter).
        public var rangeBytes: Int64
        /// Requests in flight at once, over all peers and attachments (one per attachment).
        public var maxConcurrentRequests: Int
        /// Attachments larger than this are never fetched (``refused``).
        public var maxAttachmentBytes: Int64
        /// Failed verifications or failed requests a peer may cause for one attachment before it
        /// is treated as not having it (until it says it has it, or reconnects).
        public var maxFailuresPerPeer: Int

        /// Ranges of 256 KiB, 4 requests in flight, attachments up to 64 MiB, 2 failures per peer.
        public init(rangeBytes: Int64 = 256 << 10, maxConcurrentRequests: Int = 4,
                    maxAttachmentBytes: Int64 = 64 << 20, maxFailuresPerPeer: Int = 2) {
            precondition(rangeBytes > 0 && maxConcurrentRequests > 0 && maxFailuresPerPeer > 0)
            self.rangeBytes = rangeBytes
            self.maxConcurrentRequests = maxConcurrentRequests
            self.maxAttachmentBytes = maxAttachmentBytes
            self.maxFailuresPerPeer = maxFailuresPerPeer
        }
    }

    /// What happened: in the app (references), on disk, or from peers.
    package enum Event: Sendable, Equatable {
        /// A live record references this attachment.
        case referenced(Attachment)
        /// No live record references it any more: stop fetching it.
        case unreferenced(AttachmentHash)
        /// The complete, verified bytes are in the store (added on this device, or found there).
        case availableLocally(AttachmentHash)
        /// The store holds `bytes` of it in a `.partial` file (told at start-up, so a transfer
        /// interrupted by a crash or a lost connection resumes there).
        case partialOnDisk(AttachmentHash, bytes: Int64)
        case peerConnected(ReplicaID)
        case peerDisconnected(ReplicaID)
        /// The peer said it holds the complete bytes.
        case peerHas(ReplicaID, AttachmentHash)
        /// The peer said it does not (an `attachmentUnavailable` answer).
        case peerLacks(ReplicaID, AttachmentHash)
        /// An `attachmentData` message arrived.
        case received(from: ReplicaID, AttachmentHash, offset: Int64, total: Int64, bytes: [UInt8])
        /// The answer to a `.verifyPartial`: whether the `.partial` file's SHA-256 is the hash.
        case verified(AttachmentHash, matches: Bool)
        /// A request got no answer in time, or its bytes could not be written.
        case requestFailed(ReplicaID, AttachmentHash)
    }

    /// What the shell must do, in the order given.
    package enum Action: Sendable, Equatable {
        /// Send `attachmentRequest(hash, offset, length)` to the peer.
        case request(ReplicaID, AttachmentHash, offset: Int64, length: Int64)
        /// Write `bytes` at `offset` of the hash's `.partial` file, dropping anything after it.
        case writePartial(AttachmentHash, offset: Int64, bytes: [UInt8])
        /// Compute the SHA-256 of the complete `.partial` file; report `.verified`.
        case verifyPartial(AttachmentHash)
        /// Make the verified `.partial` file durable and give it its final name.
        case promotePartial(AttachmentHash)
        /// Delete the `.partial` file (its bytes did not hash right, or it was longer than the attachment).
        case discardPartial(AttachmentHash)
    }

    private enum Phase: Equatable {
        case idle
        case requesting(ReplicaID, offset: Int64, length: Int64)
        case verifying
    }

    private struct Transfer {
        let attachment: Attachment
        let order: UInt64
        var received: Int64
        var phase = Phase.idle
        /// Peers that supplied bytes since the last verification.
        var sources: Set<ReplicaID> = []
        var failures: [ReplicaID: Int] = [:]
    }

    /// The bounds this machine keeps.
    public let configuration: Configuration
    private var transfers: [AttachmentHash: Transfer] = [:]
    private var partials: [AttachmentHash: Int64] = [:]
    private var local: Set<AttachmentHash> = []
    private var connected: Set<ReplicaID> = []
    /// What each connected peer said about an attachment: true = has it, false = lacks it.
    private var knowledge: [ReplicaID: [AttachmentHash: Bool]] = [:]
    private var nextOrder: UInt64 = 0
    /// Referenced attachments over ``Configuration/maxAttachmentBytes``.
    public private(set) var refused: Set<AttachmentHash> = []

    /// A machine with nothing referenced, stored or connected yet.
    public init(configuration: Configuration = Configuration()) {
        self.configuration = configuration
    }

    // MARK: - Queries

    /// Attachments being fetched (referenced, missing here, within the size bound), oldest first.
    public var pending: [AttachmentHash] {
        transfers.sorted { $0.value.order < $1.value.order }.map(\.key)
    }

    /// Requests in flight.
    public var requestsInFlight: Int {
        transfers.values.count { if case .requesting = $0.phase { true } else { false } }
    }

    /// Bytes received so far and the total, for a progress display; nil if not being fetched.
    public func progress(of hash: AttachmentHash) -> (received: Int64, total: Int64)? {
        transfers[hash].map { ($0.received, $0.attachment.byteCount) }
    }

    // MARK: - Events

    /// Takes one event; returns what to do, in order.
    public mutating func handle(_ event: Event) -> [Action] {
        var actions: [Action] = []
        switch event {
        case .referenced(let attachment):
            let hash = attachment.contentHash
            guard transfers[hash] == nil, !local.contains(hash) else { break }
            guard attachment.byteCount <= configuration.maxAttachmentBytes else {
                refused.insert(hash)
                break
            }
            var transfer = Transfer(attachment: attachment, order: nextOrder, received: partials[hash] ?? 0)
            nextOrder += 1
            if transfer.received > attachment.byteCount {
                actions.append(.discardPartial(hash))
                transfer.received = 0
                partials[hash] = nil
            }
            if attachment.byteCount == 0 {
                actions.append(.writePartial(hash, offset: 0, bytes: []))
            }
            if transfer.received == attachment.byteCount {
                transfer.phase = .verifying
                actions.append(.verifyPartial(hash))
            }
            transfers[hash] = transfer
        case .unreferenced(let hash):
            transfers[hash] = nil
            refused.remove(hash)
        case .availableLocally(let hash):
            local.insert(hash)
            transfers[hash] = nil
            partials[hash] = nil
        case .partialOnDisk(let hash, let bytes):
            partials[hash] = bytes
            if var transfer = transfers[hash], transfer.phase == .idle {
                if bytes > transfer.attachment.byteCount {
                    actions.append(.discardPartial(hash))
                    transfer.received = 0
                } else {
                    transfer.received = bytes
                    if bytes == transfer.attachment.byteCount {
                        transfer.phase = .verifying
                        actions.append(.verifyPartial(hash))
                    }
                }
                transfers[hash] = transfer
            }
        case .peerConnected(let peer):
            connected.insert(peer)
        case .peerDisconnected(let peer):
            connected.remove(peer)
            knowledge[peer] = nil
            for (hash, transfer) in transfers {
                if case .requesting(peer, _, _) = transfer.phase { transfers[hash]!.phase = .idle }
                if transfer.failures[peer] != nil { transfers[hash]!.failures[peer] = nil }
            }
        case .peerHas(let peer, let hash):
            knowledge[peer, default: [:]][hash] = true
            transfers[hash]?.failures[peer] = nil
        case .peerLacks(let peer, let hash):
            knowledge[peer, default: [:]][hash] = false
            if case .requesting(peer, _, _)? = transfers[hash]?.phase { transfers[hash]!.phase = .idle }
        case .received(let peer, let hash, let offset, let total, let bytes):
            actions += receive(from: peer, hash, offset: offset, total: total, bytes: bytes)
        case .verified(let hash, let matches):
            guard var transfer = transfers[hash], transfer.phase == .verifying else { break }
            if matches {
                actions.append(.promotePartial(hash))
                transfers[hash] = nil
                partials[hash] = nil
                local.insert(hash)
            } else {
                actions.append(.discardPartial(hash))
                transfer.received = 0
                partials[hash] = nil
                for source in transfer.sources { fail(source, &transfer) }
                transfer.sources = []
                transfer.phase = .idle
                transfers[hash] = transfer
                if transfer.attachment.byteCount == 0 {
                    // An empty file always hashes right; a mismatch here means the hash is
                    // not the empty one, and no peer can ever send bytes for it.
                    transfers[hash] = nil
                    refused.insert(hash)
                }
            }
        case .requestFailed(let peer, let hash):
            guard var transfer = transfers[hash], case .requesting(peer, _, _) = transfer.phase else { break }
            fail(peer, &transfer)
            transfer.phase = .idle
            transfers[hash] = transfer
        }
        actions += schedule()
        return actions
    }

    private func fail(_ peer: ReplicaID, _ transfer: inout Transfer) {
        transfer.failures[peer, default: 0] += 1
    }

    private mutating func receive(from peer: ReplicaID, _ hash: AttachmentHash, offset: Int64, total: Int64,
                                  bytes: [UInt8]) -> [Action] {
        guard var transfer = transfers[hash], case .requesting(peer, let expected, let length) = transfer.phase,
              offset == expected else {
            return []  // unsolicited, late (after a disconnect or an unreference), or a duplicate
        }
        let count = Int64(bytes.count)
        guard total == transfer.attachment.byteCount, count > 0, count <= length, offset + count <= total else {
            // The peer holds different bytes under this hash, or misbehaves: ask someone else.
            fail(peer, &transfer)
            knowledge[peer, default: [:]][hash] = false
            transfer.phase = .idle
            transfers[hash] = transfer
            return []
        }
        var actions: [Action] = [.writePartial(hash, offset: offset, bytes: bytes)]
        transfer.received = offset + count
        transfer.sources.insert(peer)
        if transfer.received == total {
            transfer.phase = .verifying
            actions.append(.verifyPartial(hash))
        } else {
            let next = min(configuration.rangeBytes, total - transfer.received)
            transfer.phase = .requesting(peer, offset: transfer.received, length: next)
            actions.append(.request(peer, hash, offset: transfer.received, length: next))
        }
        transfers[hash] = transfer
        return actions
    }

    /// Starts requests for idle transfers, oldest first, while fewer than the bound are in flight.
    private mutating func schedule() -> [Action] {
        var inFlight = requestsInFlight
        guard inFlight < configuration.maxConcurrentRequests, !connected.isEmpty else { return [] }
        var perPeer: [ReplicaID: Int] = [:]
        for transfer in transfers.values {
            if case .requesting(let peer, _, _) = transfer.phase { perPeer[peer, default: 0] += 1 }
        }
        var actions: [Action] = []
        let idle = transfers.filter { $0.value.phase == .idle }.sorted { $0.value.order < $1.value.order }
        for (hash, transfer) in idle {
            guard inFlight < configuration.maxConcurrentRequests else { break }
            guard let peer = choosePeer(for: hash, transfer, load: perPeer) else { continue }
            let length = min(configuration.rangeBytes, transfer.attachment.byteCount - transfer.received)
            transfers[hash]!.phase = .requesting(peer, offset: transfer.received, length: length)
            actions.append(.request(peer, hash, offset: transfer.received, length: length))
            perPeer[peer, default: 0] += 1
            inFlight += 1
        }
        return actions
    }

    /// A connected peer not known to lack the attachment and under the failure bound: those that
    /// said they have it first, then the least loaded, then the lowest ID (deterministic).
    private func choosePeer(for hash: AttachmentHash, _ transfer: Transfer, load: [ReplicaID: Int]) -> ReplicaID? {
        connected.filter { peer in
            knowledge[peer]?[hash] != false && (transfer.failures[peer] ?? 0) < configuration.maxFailuresPerPeer
        }.min { a, b in
            let hasA = knowledge[a]?[hash] == true, hasB = knowledge[b]?[hash] == true
            if hasA != hasB { return hasA }
            let loadA = load[a] ?? 0, loadB = load[b] ?? 0
            if loadA != loadB { return loadA < loadB }
            return a < b
        }
    }

    /// The part of a complete local attachment of `total` bytes to send for a request of
    /// `length` bytes at `offset`: at most `maxLength` bytes; nil if the request is outside the
    /// file (answer with `attachmentUnavailable` then).
    public static func servedRange(offset: Int64, length: Int64, total: Int64, maxLength: Int64) -> Range<Int64>? {
        guard offset >= 0, length > 0, offset < total else { return nil }
        return offset..<min(total, offset + min(length, maxLength))
    }
}
