@_spi(Engine) import PeerSyncCRDT

/// Why a session ends (in `goodbye` and `error` messages).
public enum CloseReason: UInt64, Sendable, Equatable, CustomStringConvertible {
    case normal = 0
    case protocolVersion = 1
    case clockSkew = 2
    case sameReplica = 3
    case duplicateConnection = 4
    case malformed = 5
    case frameTooLarge = 6
    case shuttingDown = 7
    case timeout = 8
    case overloaded = 9
    case unknownMessage = 10
    /// The receiver found its own store restored from an older copy (the sender knows writes in
    /// its name it does not have); it continues as a new replica.
    case replicaRestored = 11
    /// The sender's device is not admitted: another group, unknown, failed authentication, or an
    /// invite that cannot be used (the text says which).
    case notAdmitted = 12
    /// The receiver's roster says the sender's device was removed from the group.
    case deviceRemoved = 13
    /// A delta or chunk names a replica ID (in a dot or its context) that no device of the
    /// receiver's roster claims, counting the claims it carries itself.
    case unclaimedReplica = 14
    /// A compaction report (`seen`, §19) that no honest peer sends: not signed by the device it
    /// names, for another group, or a device reporting for a replica another device claims.
    case forgedReport = 15
    case other = 99

    public var description: String {
        switch self {
        case .normal: "normal close"
        case .protocolVersion: "protocol version mismatch"
        case .clockSkew: "clock skew too large"
        case .sameReplica: "connected to itself"
        case .duplicateConnection: "duplicate connection"
        case .malformed: "malformed frame"
        case .frameTooLarge: "frame too large"
        case .shuttingDown: "shutting down"
        case .timeout: "peer silent too long"
        case .overloaded: "peer overloaded"
        case .unknownMessage: "unknown message type"
        case .replicaRestored: "store restored from an older copy; continuing as a new replica"
        case .notAdmitted: "not admitted to the group"
        case .deviceRemoved: "this device was removed from the group"
        case .unclaimedReplica: "writes by a replica no device of the group claims"
        case .forgedReport: "a forged compaction report"
        case .other: "other"
        }
    }
}

/// Optional parts of the protocol a node speaks, announced in its hello (field 11, a bit set;
/// absent = none). A node sends a peer the messages of a feature only if the peer announced it.
package struct HelloFeatures: OptionSet, Sendable, Hashable {
    package let rawValue: UInt64
    package init(rawValue: UInt64) { self.rawValue = rawValue }

    /// Serves and reads attachment messages (types 13–15, docs/PROTOCOL.md "Attachments").
    package static let attachments = HelloFeatures(rawValue: 1 << 0)
    /// Sent and read the unsigned compaction gossip of the previous version (`seen` format 01).
    /// No longer announced or honoured: an unsigned report could make a node forget (issue 32).
    package static let unsignedSeenGossip = HelloFeatures(rawValue: 1 << 1)
    /// Reads catch-up chunks whose delta is deflated (chunk field 5, docs/PROTOCOL.md §5.2).
    package static let deflatedChunks = HelloFeatures(rawValue: 1 << 2)
    /// Reads event-form deltas whose counter is relative to the writer's previous event (form
    /// 02, docs/PROTOCOL.md §7.3).
    package static let eventCounters = HelloFeatures(rawValue: 1 << 3)
    /// Sends and reads the compaction gossip of signed reports (`seen` format 02, type 16,
    /// docs/PROTOCOL.md §19), complete catch-up rounds (chunk field 6, §6.5) and the auth's
    /// `lostSince` (§6.9).
    package static let signedReports = HelloFeatures(rawValue: 1 << 4)
}

/// The first message each side sends.
package struct Hello: Sendable, Equatable {
    package var protocolVersion: UInt64
    package var replicaID: ReplicaID
    package var name: String
    /// The sender's wall clock, milliseconds since 1970, when it sent the hello.
    package var wallClockMilliseconds: UInt64
    /// Every dot the sender has seen; the receiver sends what this lacks.
    package var context: CausalContext
    /// The largest frame the sender accepts.
    package var maxFrameBytes: UInt64
    package var digest: StateDigest
    /// The sync group (16 bytes); peers of another group are refused. Required from version 2.
    package var groupID: [UInt8]?
    /// The sender's device public key, an uncompressed P-256 point (65 bytes). Required from version 2.
    package var deviceKey: [UInt8]?
    /// 16 random bytes the peer signs in its `auth` (so an auth cannot be replayed). Required from version 2.
    package var nonce: [UInt8]?
    /// The optional features the sender speaks (field 11; unknown bits are ignored).
    package var features: HelloFeatures

    package init(protocolVersion: UInt64 = WireLimits.protocolVersion, replicaID: ReplicaID, name: String,
                wallClockMilliseconds: UInt64, context: CausalContext,
                maxFrameBytes: UInt64 = UInt64(WireLimits.defaultMaxFrameBytes), digest: StateDigest,
                groupID: [UInt8]? = nil, deviceKey: [UInt8]? = nil, nonce: [UInt8]? = nil, features: HelloFeatures = []) {
        self.protocolVersion = protocolVersion
        self.replicaID = replicaID
        self.name = name
        self.wallClockMilliseconds = wallClockMilliseconds
        self.context = context
        self.maxFrameBytes = maxFrameBytes
        self.digest = digest
        self.groupID = groupID
        self.deviceKey = deviceKey
        self.nonce = nonce
        self.features = features
    }
}

/// Every message of the protocol. Deltas and chunks carry their payload still encoded: its
/// decoding depends on the session's ``WireDictionary`` (see ``WireDelta``).
package enum Message: Sendable, Equatable {
    case hello(Hello)
    /// Part `index` of `count` of the catch-up; the last chunk's delta carries the sender's context.
    /// `delta` is always the delta itself: decoding inflates a deflated one, and
    /// ``encodedFrame(deflatingChunk:)`` deflates it on the way out. `stable` (first chunk only):
    /// the round is *complete* — every record the sender holds — because the receiver's hello
    /// lacked part of the stable context the sender compacted with, which this is (§6.5).
    case chunk(index: UInt64, count: UInt64, records: UInt64, delta: [UInt8], stable: CausalContext? = nil)
    case delta([UInt8])
    /// The receiver's context after applying what it got, and (if known) the replicas it has an
    /// established session with — a peer then does not forward it deltas those replicas send it
    /// directly. `incremental`: the context holds only the entries (replicas) that changed since
    /// the sender's previous ack in this session; join it into what that ack said.
    case ack(CausalContext, neighbors: [ReplicaID]?, incremental: Bool = false)
    case digest(StateDigest, records: UInt64)
    case ping(UInt64)
    case pong(UInt64)
    case goodbye(CloseReason, String)
    case error(CloseReason, String)
    /// The sender's digest split by collection and writer, sent when digests differ although
    /// the contexts are equal (a divergence the convergence watchdog repairs).
    case breakdown(StateDigest, DigestBreakdown)
    /// Proof that the sender holds the device key of its hello: a signature over both hellos'
    /// nonces (docs/PROTOCOL.md §4).
    /// `lostSince`: the sender knows writes in the receiver's name beyond what the receiver's
    /// hello holds (it was restored from an older copy, §6.9), the newest of them or of the
    /// reports signed for that replica made at this time (ms since 1970).
    case auth(signature: [UInt8], lostSince: UInt64? = nil)
    /// A device not on the receiver's roster presents the roster entries that admit it: first
    /// the entry that admits it (a joiner's enrol with its invite token, a legacy enrol, or an
    /// admin's add), then the entries that authorise that one (PROTOCOL.md §5.10, §6.4). Never
    /// empty; at most ``maxJoinEntries``.
    case join(entries: [[UInt8]])

    /// Most roster entries one join carries (field 1 and the repeated field 2).
    package static let maxJoinEntries = 64

    /// Frame types. 13–15 are the attachment messages (``AttachmentWireLimits/kinds``), sent
    /// only to peers that announce ``HelloFeatures/attachments``; they are not `Message` cases.
    package enum Kind: UInt8, Sendable {
        case hello = 1, chunk = 2, delta = 3, ack = 4, digest = 5, ping = 6, pong = 7, goodbye = 8, error = 9, auth = 10, breakdown = 11, join = 12
    }

    package var kind: Kind {
        switch self {
        case .hello: .hello
        case .chunk: .chunk
        case .delta: .delta
        case .ack: .ack
        case .digest: .digest
        case .ping: .ping
        case .pong: .pong
        case .goodbye: .goodbye
        case .error: .error
        case .breakdown: .breakdown
        case .auth: .auth
        case .join: .join
        }
    }

    /// The frame bytes of this message. `deflatingChunk`: a chunk's delta deflated when that
    /// makes it smaller (only for a peer whose hello announced ``HelloFeatures/deflatedChunks``).
    package func encodedFrame(deflatingChunk: Bool = false) -> [UInt8] {
        Frame.encode(type: kind.rawValue, body: body(deflatingChunk: deflatingChunk))
    }

    func body(deflatingChunk: Bool = false) -> [UInt8] {
        var w = FieldWriter()
        switch self {
        case .hello(let h):
            w.varint(1, h.protocolVersion)
            w.bytes(2, replicaBytes(h.replicaID))
            w.string(3, h.name)
            w.varint(4, h.wallClockMilliseconds)
            w.bytes(5, h.context.encodedBlob())
            w.varint(6, h.maxFrameBytes)
            w.bytes(7, replicaBytes(ReplicaID(high: h.digest.high, low: h.digest.low)))
            if let groupID = h.groupID { w.bytes(8, groupID) }
            if let key = h.deviceKey { w.bytes(9, key) }
            if let nonce = h.nonce { w.bytes(10, nonce) }
            if !h.features.isEmpty { w.varint(11, h.features.rawValue) }
        case .chunk(let index, let count, let records, let delta, let stable):
            w.varint(1, index)
            w.varint(2, count)
            w.varint(3, records)
            if deflatingChunk, let packed = ChunkDeflate.deflate(delta) {
                w.bytes(4, packed)
                w.varint(5, UInt64(delta.count))
            } else {
                w.bytes(4, delta)
            }
            if let stable { w.bytes(6, stable.encodedBlob()) }
        case .delta(let delta):
            return delta  // the body is the delta itself: the smallest frame for the most frequent message
        case .ack(let context, let neighbors, let incremental):
            w.bytes(1, context.encodedBlob())
            if let neighbors { w.bytes(2, neighbors.flatMap(\.bigEndianBytes)) }
            if incremental { w.varint(3, 1) }
        case .digest(let digest, let records):
            w.bytes(1, replicaBytes(ReplicaID(high: digest.high, low: digest.low)))
            w.varint(2, records)
        case .ping(let nonce), .pong(let nonce):
            w.varint(1, nonce)
        case .goodbye(let reason, let text), .error(let reason, let text):
            w.varint(1, reason.rawValue)
            w.string(2, text)
        case .breakdown(let digest, let parts):
            w.bytes(1, replicaBytes(ReplicaID(high: digest.high, low: digest.low)))
            var collections: [UInt8] = []
            Varint.append(UInt64(parts.collections.count), to: &collections)
            for (name, d) in parts.collections.sorted(by: { $0.key < $1.key }) {
                Varint.append(UInt64(name.utf8.count), to: &collections)
                collections += name.utf8
                collections += ReplicaID(high: d.high, low: d.low).bigEndianBytes
            }
            w.bytes(2, collections)
            var writers: [UInt8] = []
            for (id, d) in parts.writers.sorted(by: { $0.key < $1.key }) {
                writers += id.bigEndianBytes + ReplicaID(high: d.high, low: d.low).bigEndianBytes
            }
            w.bytes(3, writers)
        case .auth(let signature, let lostSince):
            w.bytes(1, signature)
            if let lostSince { w.varint(2, lostSince) }
        case .join(let entries):
            if let first = entries.first { w.bytes(1, first) }
            for entry in entries.dropFirst() { w.bytes(2, entry) }
        }
        return w.bytes
    }

    /// Decodes a frame's type and body.
    package static func decode(type: UInt8, body: [UInt8]) throws(WireError) -> Message {
        guard let kind = Kind(rawValue: type) else { throw .unknownMessageType(type) }
        if kind == .delta {
            guard !body.isEmpty else { throw .malformed(message: "delta", detail: "empty") }
            return .delta(body)
        }
        return try decodeFields(kind, FieldReader(message: "\(kind)", body: body, repeating: kind == .join ? [2] : []))
    }

    private static func decodeFields(_ kind: Kind, _ f: FieldReader) throws(WireError) -> Message {
        switch kind {
        case .hello:
            let context: CausalContext
            do { context = try CausalContext(blob: try f.bytes(5, "context")) } catch let error as WireError { throw error } catch {
                throw .malformed(message: "hello", detail: "context: \(error)")
            }
            let digest = try replica(f.bytes(7, "digest"), "hello")
            return .hello(Hello(
                protocolVersion: try f.varint(1, "protocolVersion"),
                replicaID: try replica(f.bytes(2, "replicaID"), "hello"),
                name: try f.string(3, "name"),
                wallClockMilliseconds: try f.varint(4, "wallClock"),
                context: context,
                maxFrameBytes: try f.varint(6, "maxFrameBytes"),
                digest: StateDigest(high: digest.high, low: digest.low),
                groupID: f.blobs[8], deviceKey: f.blobs[9], nonce: f.blobs[10],
                features: HelloFeatures(rawValue: f.varints[11] ?? 0)))
        case .chunk:
            let index = try f.varint(1, "index")
            let count = try f.varint(2, "count")
            guard index < count else { throw .malformed(message: "chunk", detail: "index \(index) of \(count)") }
            guard count <= WireLimits.maxChunksPerRound else {
                throw .malformed(message: "chunk", detail: "count \(count) exceeds \(WireLimits.maxChunksPerRound)")
            }
            let records = try f.varint(3, "records")
            var delta = try f.bytes(4, "delta")
            if let inflated = f.varints[5] { delta = try ChunkDeflate.inflate(delta, to: inflated) }
            // Every record takes more than one byte of the delta.
            guard records <= UInt64(delta.count) else {
                throw .malformed(message: "chunk", detail: "\(records) records in a delta of \(delta.count) bytes")
            }
            var stable: CausalContext?
            if let blob = f.blobs[6] {
                guard index == 0 else { throw .malformed(message: "chunk", detail: "a stable context on chunk \(index), not the first") }
                do { stable = try CausalContext(blob: blob) } catch {
                    throw .malformed(message: "chunk", detail: "stable context: \(error)")
                }
                if let violation = stable?.limitViolation { throw .malformed(message: "chunk", detail: "stable context: \(violation)") }
            }
            return .chunk(index: index, count: count, records: records, delta: delta, stable: stable)
        case .ack:
            let context: CausalContext
            do { context = try CausalContext(blob: try f.bytes(1, "context")) } catch let error as WireError { throw error } catch {
                throw .malformed(message: "ack", detail: "context: \(error)")
            }
            let incremental = (f.varints[3] ?? 0) != 0
            guard let raw = f.blobs[2] else { return .ack(context, neighbors: nil, incremental: incremental) }
            guard raw.count % 16 == 0, raw.count <= 16 * 4_096 else {
                throw .malformed(message: "ack", detail: "neighbors must be 16-byte IDs, at most 4,096")
            }
            let neighbors = stride(from: 0, to: raw.count, by: 16).map { ReplicaID(bigEndianBytes: raw[$0..<($0 + 16)])! }
            return .ack(context, neighbors: neighbors, incremental: incremental)
        case .digest:
            let d = try replica(f.bytes(1, "digest"), "digest")
            return .digest(StateDigest(high: d.high, low: d.low), records: f.varints[2] ?? 0)
        case .ping: return .ping(f.varints[1] ?? 0)
        case .pong: return .pong(f.varints[1] ?? 0)
        case .goodbye, .error:
            let reason = CloseReason(rawValue: f.varints[1] ?? 99) ?? .other
            let text = (try? f.string(2, "text")) ?? ""
            return kind == .goodbye ? .goodbye(reason, text) : .error(reason, text)
        case .delta:
            throw .malformed(message: "delta", detail: "a delta has no fields")
        case .breakdown:
            let d = try replica(f.bytes(1, "digest"), "breakdown")
            var parts = DigestBreakdown()
            var r = ByteReader(try f.bytes(2, "collections"))
            guard let count = r.readVarint(), count <= UInt64(r.remaining) else {
                throw .malformed(message: "breakdown", detail: "collection count")
            }
            for _ in 0..<count {
                guard let name = r.readLengthPrefixed().flatMap({ String(validating: $0, as: UTF8.self) }),
                      let raw = r.readBytes(16), let digest = ReplicaID(bigEndianBytes: raw) else {
                    throw .malformed(message: "breakdown", detail: "collection entry")
                }
                parts.collections[name] = StateDigest(high: digest.high, low: digest.low)
            }
            guard r.isAtEnd else { throw .malformed(message: "breakdown", detail: "trailing bytes") }
            let writers = try f.bytes(3, "writers")
            guard writers.count % 32 == 0 else { throw .malformed(message: "breakdown", detail: "writer entries are 32 bytes") }
            for start in stride(from: 0, to: writers.count, by: 32) {
                let id = ReplicaID(bigEndianBytes: writers[start..<(start + 16)])!
                let digest = ReplicaID(bigEndianBytes: writers[(start + 16)..<(start + 32)])!
                parts.writers[id] = StateDigest(high: digest.high, low: digest.low)
            }
            return .breakdown(StateDigest(high: d.high, low: d.low), parts)
        case .auth:
            let signature = try f.bytes(1, "signature")
            guard signature.count == 64 else { throw .malformed(message: "auth", detail: "a signature has 64 bytes, got \(signature.count)") }
            return .auth(signature: signature, lostSince: f.varints[2])
        case .join:
            let entries = [try f.bytes(1, "entry")] + (f.lists[2] ?? [])
            guard entries.count <= maxJoinEntries else {
                throw .malformed(message: "join", detail: "\(entries.count) entries, at most \(maxJoinEntries)")
            }
            if let long = entries.first(where: { $0.count > 262_144 }) {
                throw .malformed(message: "join", detail: "entry of \(long.count) bytes")
            }
            return .join(entries: entries)
        }
    }
}

func replicaBytes(_ id: ReplicaID) -> [UInt8] { id.bigEndianBytes }

func replica(_ bytes: [UInt8], _ message: String) throws(WireError) -> ReplicaID {
    guard let id = ReplicaID(bigEndianBytes: bytes) else {
        throw .malformed(message: message, detail: "an ID must be 16 bytes, got \(bytes.count)")
    }
    return id
}
