import PeerSyncCRDT
import PeerSyncWire

/// The rules of one session, with no sockets: what a received frame means and what to do
/// about it. The NIO shell (``SyncNode``) carries the actions out.
///
/// ```
/// awaitingHello ──hello ok──▶ established ──goodbye/error/bad frame──▶ closed
///       │                         │  chunk 0..n-1 (catch-up rounds), delta, ack,
///       └──anything else──▶ closed   digest, ping → pong
/// ```
struct SessionStateMachine {
    enum Phase: Equatable { case awaitingHello, established, closed }

    enum Action {
        case send(Message)
        /// The peer's hello passed every check: register the session and start the catch-up.
        case established(Hello)
        /// `stable` (first chunk only): the round is complete, sent because this side is behind
        /// the peer's stable context (PROTOCOL §6.5).
        case applyChunk(RecordMap, index: UInt64, count: UInt64, records: UInt64, stable: CausalContext?)
        case applyDelta(RecordMap)
        case acked(CausalContext, neighbors: [ReplicaID]?, incremental: Bool)
        case digest(StateDigest, records: UInt64)
        case breakdown(StateDigest, DigestBreakdown)
        case auth(signature: [UInt8], lostSince: UInt64?)
        case join(entries: [[UInt8]])
        /// End the session; if `notifyPeer`, send `.error(reason, text)` first.
        case close(CloseReason, String, notifyPeer: Bool)
    }

    let localReplica: ReplicaID
    let maxClockSkewMilliseconds: UInt64
    private(set) var phase = Phase.awaitingHello
    private(set) var peer: Hello?
    private var inbound: WireDictionary?
    private var expectedChunk: UInt64 = 0
    private var chunkCount: UInt64 = 0

    init(localReplica: ReplicaID, maxClockSkewMilliseconds: UInt64) {
        self.localReplica = localReplica
        self.maxClockSkewMilliseconds = maxClockSkewMilliseconds
    }

    /// Handles one inbound frame, received when the local wall clock read `now` (ms).
    mutating func receive(type: UInt8, body: [UInt8], now: UInt64) -> [Action] {
        guard phase != .closed else { return [] }
        let message: Message
        do {
            message = try Message.decode(type: type, body: body)
        } catch {
            return close(error == .unknownMessageType(type) ? .unknownMessage : .malformed, "\(error)", notify: true)
        }
        switch (phase, message) {
        case (.awaitingHello, .hello(let hello)):
            return accept(hello, now: now)
        case (.awaitingHello, .goodbye(let reason, let text)), (.awaitingHello, .error(let reason, let text)),
             (.established, .goodbye(let reason, let text)), (.established, .error(let reason, let text)):
            phase = .closed
            return [.close(reason, text.isEmpty ? "\(reason)" : text, notifyPeer: false)]
        case (.awaitingHello, _):
            return close(.malformed, "expected hello first, got \(message.kind)", notify: true)
        case (.established, .hello):
            return close(.malformed, "second hello", notify: true)
        case (.established, .chunk(let index, let count, let records, let bytes, let stable)):
            if index == 0 {
                expectedChunk = 0
                chunkCount = count
            }
            guard index == expectedChunk, count == chunkCount else {
                return close(.malformed, "chunk \(index) of \(count), expected \(expectedChunk) of \(chunkCount)", notify: true)
            }
            expectedChunk = index + 1 == count ? 0 : index + 1
            return decodeDelta(bytes, now: now).map { [.applyChunk($0, index: index, count: count, records: records, stable: stable)] }
                ?? close(.malformed, lastError, notify: true)
        case (.established, .delta(let bytes)):
            return decodeDelta(bytes, now: now).map { [.applyDelta($0)] } ?? close(.malformed, lastError, notify: true)
        case (.established, .ack(let context, let neighbors, let incremental)):
            return [.acked(context, neighbors: neighbors, incremental: incremental)]
        case (.established, .digest(let digest, let records)):
            return [.digest(digest, records: records)]
        case (.established, .breakdown(let digest, let parts)):
            return [.breakdown(digest, parts)]
        case (.established, .auth(let signature, let lostSince)):
            return [.auth(signature: signature, lostSince: lostSince)]
        case (.established, .join(let entries)):
            return [.join(entries: entries)]
        case (.established, .ping(let nonce)):
            return [.send(.pong(nonce))]
        case (.established, .pong):
            return []
        case (.closed, _):
            return []
        }
    }

    private var lastError = ""

    private mutating func decodeDelta(_ bytes: [UInt8], now: UInt64) -> RecordMap? {
        guard let inbound else { return nil }
        do {
            let delta = try WireDelta.decode(bytes, with: inbound)
            if let refusal = DeltaAdmission.refusal(of: delta, now: now, maxSkewMilliseconds: maxClockSkewMilliseconds) {
                lastError = refusal
                return nil
            }
            return delta
        } catch {
            lastError = "\(error)"
            return nil
        }
    }

    private mutating func accept(_ hello: Hello, now: UInt64) -> [Action] {
        guard hello.protocolVersion == WireLimits.protocolVersion else {
            return close(.protocolVersion, "peer speaks protocol version \(hello.protocolVersion), this node \(WireLimits.protocolVersion); upgrade the older one", notify: true)
        }
        guard hello.replicaID != localReplica else {
            return close(.sameReplica, "connected to itself (replica \(hello.replicaID.shortDescription))", notify: true)
        }
        let offset = Int64(bitPattern: hello.wallClockMilliseconds &- now)
        guard offset.magnitude <= maxClockSkewMilliseconds else {
            let seconds = Double(offset) / 1000
            let direction = offset > 0 ? "ahead of" : "behind"
            return close(.clockSkew, "clock offset \(formatSeconds(seconds.magnitude)) \(direction) this node exceeds the limit of \(formatSeconds(Double(maxClockSkewMilliseconds) / 1000)); fix the clock (NTP) on the wrong machine", notify: true)
        }
        guard hello.maxFrameBytes >= 64 << 10 else {
            return close(.malformed, "peer accepts frames of only \(hello.maxFrameBytes) bytes", notify: true)
        }
        guard hello.groupID?.count == 16, hello.deviceKey?.count == 65, hello.nonce?.count == 16 else {
            return close(.malformed, "hello lacks its group ID (16 bytes), device key (65) or nonce (16)", notify: true)
        }
        phase = .established
        peer = hello
        inbound = WireDictionary(startingAt: hello.wallClockMilliseconds)
        return [.established(hello)]
    }

    private mutating func close(_ reason: CloseReason, _ text: String, notify: Bool) -> [Action] {
        phase = .closed
        return [.close(reason, text, notifyPeer: notify)]
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
