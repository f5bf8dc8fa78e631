@_spi(Engine) import PeerSyncCRDT
import PeerSyncWire

/// The rules of a session's inbound frames, with no sockets: the one place where a frame's type
/// is read, checked against the session's phase (``rule(for:in:)``, PROTOCOL §3 and §6.1) and
/// decoded into what it means (an ``Action``). ``ReplicationCore`` carries the actions out and
/// moves the session from phase to phase (``PeerSession/State``). The machine holds the peer's
/// direction of the wire: its dictionary (from its hello on) and where its catch-up round is.
///
/// ```
/// awaitingHello ──hello ok──▶ authenticating ──auth ok──▶ established
///       │                            │  └─unknown device──▶ joining ──join ok──▶ established
///       └── any violation, goodbye, error, timeout ──▶ closing ──(last frame flushed)──▶ closed
/// ```
struct SessionStateMachine {
    typealias Phase = PeerSession.Phase

    /// A frame type this side reads (PROTOCOL §3).
    enum Kind: Equatable {
        /// Types 1–12.
        case message(Message.Kind)
        /// Types 13–15, read only by a node that announced attachments (else unknown: `error(10)`).
        case attachment
        /// Type 16, read only by a node that announced signed reports (else unknown: `error(10)`).
        case seen
    }

    /// What a phase does with a frame.
    enum Rule: Equatable {
        case handle
        /// Dropped (once read: a malformed one is still refused).
        case ignore
        /// The session ends with `error(reason, text)`.
        case refuse(CloseReason, String)
    }

    /// What each phase does with each frame type: PROTOCOL §6.1 (and §18, §19 for the optional
    /// types). Types 1–12 are read before their rule applies — a malformed one is refused as
    /// malformed (5) or unknown (10) in any phase, and so are a chunk or delta whose delta does
    /// not decode once the peer's hello is read — while types 13–16 are refused unread before
    /// admission. A closing session reads nothing.
    static func rule(for kind: Kind, in phase: Phase) -> Rule {
        switch (kind, phase) {
        case (_, .closing): .ignore
        case (.attachment, .established), (.seen, .established): .handle
        case (.attachment, _): .refuse(.malformed, "attachment message before admission")
        case (.seen, _): .refuse(.notAdmitted, "seen before admission")
        case (.message(.goodbye), _), (.message(.error), _): .handle
        case (.message(.hello), .awaitingHello): .handle
        case (.message(.hello), _): .refuse(.malformed, "second hello")
        case (.message(let kind), .awaitingHello): .refuse(.malformed, "expected hello first, got \(kind)")
        case (.message(.chunk), .established), (.message(.delta), .established): .handle
        case (.message(.chunk), _), (.message(.delta), _): .refuse(.notAdmitted, "data before admission")
        case (.message(.ack), .established), (.message(.digest), .established): .handle
        case (.message(.ack), _), (.message(.digest), _): .ignore
        case (.message(.auth), .authenticating): .handle
        case (.message(.auth), _): .refuse(.malformed, "auth out of place")
        case (.message(.join), .joining): .handle
        case (.message(.join), .established): .ignore  // a peer that knows the sender already
        case (.message(.join), _): .refuse(.malformed, "join out of place")
        case (.message(.ping), _): .handle  // before admission, the pong waits for it (PeerSession.nextBatch)
        case (.message(.pong), _): .ignore
        case (.message(.breakdown), _): .handle  // informational: logged
        }
    }

    enum Action {
        case send(Message)
        /// The peer's hello passed every protocol check: the core checks its group and key next.
        case helloAccepted(Hello)
        /// `stable` (first chunk only): the round is complete, sent because this side is behind
        /// the peer's stable context (PROTOCOL §6.5).
        case applyChunk(RecordMap, index: UInt64, count: UInt64, records: UInt64, stable: CausalContext?)
        case applyDelta(RecordMap)
        case acked(CausalContext, neighbors: [ReplicaID]?, incremental: Bool)
        case digest(StateDigest, records: UInt64)
        case breakdown(StateDigest, DigestBreakdown)
        case auth(signature: [UInt8], lostSince: UInt64?)
        case join(entries: [[UInt8]])
        case attachmentRequest(AttachmentRequestBody)
        case attachmentData(AttachmentDataBody)
        case attachmentUnavailable(hash: [UInt8])
        case seen([SeenReport])
        /// End the session; if `notifyPeer`, send `.error(reason, text)` first.
        case close(CloseReason, String, notifyPeer: Bool)
    }

    let localReplica: ReplicaID
    let maxClockSkewMilliseconds: UInt64
    /// Whether this side reads the optional types: attachments (13–15), signed reports (16).
    let readsAttachments: Bool
    let readsSeen: Bool
    /// The peer's direction of the dictionary, from its hello on.
    private var inbound: WireDictionary?
    private var expectedChunk: UInt64 = 0
    private var chunkCount: UInt64 = 0

    init(localReplica: ReplicaID, maxClockSkewMilliseconds: UInt64, readsAttachments: Bool = false, readsSeen: Bool = false) {
        self.localReplica = localReplica
        self.maxClockSkewMilliseconds = maxClockSkewMilliseconds
        self.readsAttachments = readsAttachments
        self.readsSeen = readsSeen
    }

    /// Handles one inbound frame of a session in `phase`, received when the local wall clock
    /// read `now` (ms).
    mutating func receive(type: UInt8, body: [UInt8], now: UInt64, in phase: Phase) -> [Action] {
        guard phase != .closing else { return [] }
        if readsAttachments && AttachmentWireLimits.kinds.contains(type) || readsSeen && type == SeenMessage.kind {
            let kind = type == SeenMessage.kind ? Kind.seen : .attachment
            if case .refuse(let reason, let text) = Self.rule(for: kind, in: phase) { return close(reason, text) }
            do throws(WireError) {
                return [try Self.decodeOptional(type: type, body: body)]
            } catch {
                return close(.malformed, "\(error)")
            }
        }
        let message: Message
        do {
            message = try Message.decode(type: type, body: body)
        } catch {
            return close(error == .unknownMessageType(type) ? .unknownMessage : .malformed, "\(error)")
        }
        // A chunk's or delta's own delta is read once the peer's hello is (its dictionary).
        var delta: RecordMap?
        switch message {
        case .chunk(let index, let count, _, let bytes, _) where inbound != nil:
            if index == 0 {
                expectedChunk = 0
                chunkCount = count
            }
            guard index == expectedChunk, count == chunkCount else {
                return close(.malformed, "chunk \(index) of \(count), expected \(expectedChunk) of \(chunkCount)")
            }
            expectedChunk = index + 1 == count ? 0 : index + 1
            switch decodeDelta(bytes, now: now) {
            case .success(let decoded): delta = decoded
            case .failure(let refusal): return close(.malformed, refusal.text)
            }
        case .delta(let bytes) where inbound != nil:
            switch decodeDelta(bytes, now: now) {
            case .success(let decoded): delta = decoded
            case .failure(let refusal): return close(.malformed, refusal.text)
            }
        default:
            break
        }
        switch Self.rule(for: .message(message.kind), in: phase) {
        case .refuse(let reason, let text): return close(reason, text)
        case .ignore: return []
        case .handle: break
        }
        switch message {
        case .hello(let hello):
            return accept(hello, now: now)
        case .goodbye(let reason, let text), .error(let reason, let text):
            return [.close(reason, text.isEmpty ? "\(reason)" : text, notifyPeer: false)]
        case .chunk(let index, let count, let records, _, let stable):
            return delta.map { [.applyChunk($0, index: index, count: count, records: records, stable: stable)] } ?? []
        case .delta:
            return delta.map { [.applyDelta($0)] } ?? []
        case .ack(let context, let neighbors, let incremental):
            return [.acked(context, neighbors: neighbors, incremental: incremental)]
        case .digest(let digest, let records):
            return [.digest(digest, records: records)]
        case .breakdown(let digest, let parts):
            return [.breakdown(digest, parts)]
        case .auth(let signature, let lostSince):
            return [.auth(signature: signature, lostSince: lostSince)]
        case .join(let entries):
            return [.join(entries: entries)]
        case .ping(let nonce):
            return [.send(.pong(nonce))]
        case .pong:
            return []
        }
    }

    private static func decodeOptional(type: UInt8, body: [UInt8]) throws(WireError) -> Action {
        switch type {
        case SeenMessage.kind: .seen(try SeenMessage.decode(body: body))
        case AttachmentWireLimits.requestKind: .attachmentRequest(try decodeAttachmentRequest(body))
        case AttachmentWireLimits.dataKind: .attachmentData(try decodeAttachmentData(body))
        default: .attachmentUnavailable(hash: try decodeAttachmentUnavailable(body))
        }
    }

    private struct DeltaRefusal: Error {
        let text: String
    }

    private func decodeDelta(_ bytes: [UInt8], now: UInt64) -> Result<RecordMap, DeltaRefusal> {
        guard let inbound else { return .failure(DeltaRefusal(text: "")) }
        do {
            let delta = try WireDelta.decode(bytes, with: inbound)
            if let refusal = DeltaAdmission.refusal(of: delta, now: now, maxSkewMilliseconds: maxClockSkewMilliseconds) {
                return .failure(DeltaRefusal(text: refusal))
            }
            return .success(delta)
        } catch {
            return .failure(DeltaRefusal(text: "\(error)"))
        }
    }

    private mutating func accept(_ hello: Hello, now: UInt64) -> [Action] {
        guard hello.protocolVersion == WireLimits.protocolVersion else {
            return close(.protocolVersion, "peer speaks protocol version \(hello.protocolVersion), this node \(WireLimits.protocolVersion); upgrade the older one")
        }
        guard hello.replicaID != localReplica else {
            return close(.sameReplica, "connected to itself (replica \(hello.replicaID.shortDescription))")
        }
        let offset = Int64(bitPattern: hello.wallClockMilliseconds &- now)
        guard offset.magnitude <= maxClockSkewMilliseconds else {
            let seconds = Double(offset) / 1000
            let direction = offset > 0 ? "ahead of" : "behind"
            return close(.clockSkew, "clock offset \(formatSeconds(seconds.magnitude)) \(direction) this node exceeds the limit of \(formatSeconds(Double(maxClockSkewMilliseconds) / 1000)); fix the clock (NTP) on the wrong machine")
        }
        guard hello.maxFrameBytes >= 64 << 10 else {
            return close(.malformed, "peer accepts frames of only \(hello.maxFrameBytes) bytes")
        }
        guard hello.groupID?.count == 16, hello.deviceKey?.count == 65, hello.nonce?.count == 16 else {
            return close(.malformed, "hello lacks its group ID (16 bytes), device key (65) or nonce (16)")
        }
        inbound = WireDictionary(startingAt: hello.wallClockMilliseconds)
        return [.helloAccepted(hello)]
    }

    private func close(_ reason: CloseReason, _ text: String) -> [Action] {
        [.close(reason, text, notifyPeer: true)]
    }
}

func formatSeconds(_ seconds: Double) -> String {
    // Rounded, not truncated: an offset measured as 3,599.9 s (an hour less the transit time)
    // reads "1 h 0 min" on both sides of the session.
    guard seconds.isFinite, seconds < 1e15 else { return "\(seconds) s" }
    let whole = Int(seconds.rounded())
    if whole >= 3600 {
        let minutes = (whole + 30) / 60
        return "\(minutes / 60) h \(minutes % 60) min"
    }
    if whole >= 60 { return "\(whole / 60) min \(whole % 60) s" }
    return "\(whole) s"
}

/// The checks every delta from outside — a peer's frame, a bundle — passes before anything of it
/// is stored.
package enum DeltaAdmission {
    /// Why `delta` is refused, or nil. `now` is the local wall clock in ms.
    public static func refusal(of delta: RecordMap, now: UInt64, maxSkewMilliseconds: UInt64) -> String? {
        // A member with a clock far ahead must not drag every replica's clock with it.
        let newest = delta.maxTimestamp.physicalMilliseconds
        if newest > now &+ maxSkewMilliseconds, now &+ maxSkewMilliseconds >= now {
            return "delta carries a timestamp \((newest - now) / 1000) s in the future"
        }
        return nil
    }
}
