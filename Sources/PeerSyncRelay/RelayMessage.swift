@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncSeal
import PeerSyncWire

/// Why a relay refused something (docs/PROTOCOL.md §20.4). Refusals of a connection end it;
/// refusals of one upload or statement (``RelayMessage/notice(_:_:)``) leave it open.
package enum RelayRefusal: UInt64, Sendable, Equatable, CustomStringConvertible {
    case notMember = 1
    case unknownGroup = 2
    case badEnrolment = 3
    case overBytes = 4
    case overBlobs = 5
    case overConnections = 6
    case malformed = 7
    case badSignature = 8
    case staleMembers = 9
    case relayFull = 10
    case protocolVersion = 11
    case timeout = 12
    case shuttingDown = 13
    case notEnrolled = 14
    case other = 99

    public var description: String {
        switch self {
        case .notMember: "not a member of the group at this relay"
        case .unknownGroup: "the relay serves no such group"
        case .badEnrolment: "enrolment refused"
        case .overBytes: "the group's storage quota is full"
        case .overBlobs: "the group's blob quota is full"
        case .overConnections: "the group has as many connections as it may"
        case .malformed: "malformed message"
        case .badSignature: "signature does not verify"
        case .staleMembers: "a newer member list is held"
        case .relayFull: "the relay takes no more"
        case .protocolVersion: "relay protocol version mismatch"
        case .timeout: "silent too long"
        case .shuttingDown: "relay shutting down"
        case .notEnrolled: "the relay is not a member of the group any more"
        case .other: "other"
        }
    }
}

/// The messages of a relay session (docs/PROTOCOL.md §20.4), framed like sync messages (a
/// varint length, a type byte, the body). A device speaks first (hello); the relay answers
/// welcome or refused.
package enum RelayMessage: Sendable, Equatable {
    /// Device → relay: the group it comes for, its newest member list (admins; empty
    /// otherwise) and, to enrol the relay in a new group, the relay's enrolment secret.
    case hello(group: GroupID, members: RelayMembers?, enrolSecret: [UInt8]?)
    /// Device → relay: store this sealed blob (and forward it to the group's other devices).
    case upload(SealedBlob)
    /// Device → relay: what the device holds per replica (contiguous counters); the relay
    /// answers with every blob beyond, then ``caughtUp(_:)``.
    case want([ReplicaID: UInt64])
    /// Device → relay: a newer member list.
    case members(RelayMembers)
    /// Both ways: key envelopes (PROTOCOL §20.2). An admin's device gives the relay those it
    /// made; the relay gives each device, after its welcome and as they arrive, those addressed
    /// to it — outside the sealed blobs, since a device needs its key to open them.
    case keys([KeyEnvelope])
    /// Both ways: signed compaction reports (PROTOCOL §19.1), so devices that meet only through
    /// the relay learn what is stable. The relay keeps each replica's newest.
    case seen([SeenReport])
    /// Device → relay, instead of hello: a device with an invite that is not a member yet asks
    /// to reach its inviter (PROTOCOL §20.6).
    case join(group: GroupID, inviter: DeviceID)
    /// Relay → joining device: the inviter's key, so the device can seal its request to it.
    case joinWelcome(inviterKey: DevicePublicKey)
    /// Joining device → relay, and relay → inviter: the sealed request.
    case joinRequest(JoinRequest)
    case ping(UInt64)
    case pong(UInt64)
    /// Relay → device: the member list it holds (an admin sends a newer one if the roster
    /// changed), its blob count and bytes for the group, and per replica the counters its blobs
    /// cover from 1 without a gap.
    case welcome(members: RelayMembers, blobs: UInt64, bytes: UInt64, covered: [ReplicaID: UInt64])
    /// Relay → device: a blob (answering want, or forwarded as it arrived).
    case blob(SealedBlob)
    /// Relay → device: the upload of `replica`'s counters up to `last` (or a snapshot) is stored durably.
    case stored(replica: ReplicaID, last: UInt64, snapshot: Bool)
    /// Relay → device: every blob beyond the want was sent (`count` of them).
    case caughtUp(UInt64)
    /// Relay → device: the connection is refused and ends.
    case refused(RelayRefusal, String)
    /// Relay → device: one upload or statement was refused; the connection stays.
    case notice(RelayRefusal, String)

    package enum Kind: UInt8, Sendable {
        case hello = 64, upload = 65, want = 66, members = 67, ping = 68, pong = 69, keys = 70, seen = 71, join = 72, joinRequest = 73
        case welcome = 80, blob = 81, stored = 82, caughtUp = 83, refused = 84, notice = 85, joinWelcome = 86
    }

    static let version: UInt8 = 1
    /// Longest refusal text.
    static let maxText = 1024

    package var kind: Kind {
        switch self {
        case .hello: .hello
        case .upload: .upload
        case .want: .want
        case .members: .members
        case .keys: .keys
        case .seen: .seen
        case .join: .join
        case .joinWelcome: .joinWelcome
        case .joinRequest: .joinRequest
        case .ping: .ping
        case .pong: .pong
        case .welcome: .welcome
        case .blob: .blob
        case .stored: .stored
        case .caughtUp: .caughtUp
        case .refused: .refused
        case .notice: .notice
        }
    }

    /// The message as one frame.
    package var frame: [UInt8] { Frame.encode(type: kind.rawValue, body: body) }

    var body: [UInt8] {
        var w = SealWriter()
        switch self {
        case .hello(let group, let members, let secret):
            w.byte(Self.version)
            w.raw(group.bytes)
            w.lengthPrefixed(members?.bytes ?? [])
            w.lengthPrefixed(secret ?? [])
        case .upload(let blob), .blob(let blob):
            w.raw(blob.bytes)
        case .want(let vector):
            Self.write(vector, to: &w)
        case .members(let members):
            w.raw(members.bytes)
        case .keys(let envelopes):
            w.varint(UInt64(envelopes.count))
            for envelope in envelopes { w.lengthPrefixed(envelope.bytes) }
        case .seen(let reports):
            w.varint(UInt64(reports.count))
            for report in reports { w.lengthPrefixed(report.bytes) }
        case .join(let group, let inviter):
            w.byte(Self.version)
            w.raw(group.bytes)
            w.raw(inviter.bytes)
        case .joinWelcome(let key):
            w.raw(key.x963)
        case .joinRequest(let request):
            w.raw(request.bytes)
        case .ping(let nonce), .pong(let nonce):
            w.varint(nonce)
        case .welcome(let members, let blobs, let bytes, let covered):
            w.lengthPrefixed(members.bytes)
            w.varint(blobs)
            w.varint(bytes)
            Self.write(covered, to: &w)
        case .stored(let replica, let last, let snapshot):
            w.raw(replica.bigEndianBytes)
            w.varint(last)
            w.byte(snapshot ? 1 : 0)
        case .caughtUp(let count):
            w.varint(count)
        case .refused(let reason, let text), .notice(let reason, let text):
            w.varint(reason.rawValue)
            w.lengthPrefixed(Array(text.utf8.prefix(Self.maxText)))
        }
        return w.bytes
    }

    private static func write(_ vector: [ReplicaID: UInt64], to w: inout SealWriter) {
        w.varint(UInt64(vector.count))
        for (replica, counter) in vector.sorted(by: { $0.key.bigEndianBytes.lexicographicallyPrecedes($1.key.bigEndianBytes) }) {
            w.raw(replica.bigEndianBytes)
            w.varint(counter)
        }
    }

    private static func readVector(_ r: inout SealReader) throws(SealError) -> [ReplicaID: UInt64] {
        let count = try r.varint("replica count")
        guard count <= UInt64(ValidationLimits.maxContextReplicas) else { throw .malformed("relay message: \(count) replicas") }
        var vector: [ReplicaID: UInt64] = [:]
        for _ in 0..<count {
            let replica = ReplicaID(bigEndianBytes: try r.raw(16, "replica"))!
            vector[replica] = try r.varint("counter")
        }
        return vector
    }

    /// Decodes one frame's type and body; throws ``SealError/malformed(_:)`` with a line that
    /// says what is wrong.
    package static func decode(type: UInt8, body: [UInt8]) throws(SealError) -> RelayMessage {
        guard let kind = Kind(rawValue: type) else { throw .malformed("relay message of unknown type \(type)") }
        var r = SealReader(body, what: "relay \(kind)")
        let message: RelayMessage
        switch kind {
        case .hello:
            let version = try r.byte("version")
            guard version == Self.version else { throw .malformed("relay protocol version \(version), this side speaks \(Self.version)") }
            let group = GroupID(bytes: try r.raw(16, "group"))!
            let members = try r.lengthPrefixed("members", max: 1 << 20)
            let secret = try r.lengthPrefixed("enrolment secret", max: 64)
            message = .hello(group: group, members: members.isEmpty ? nil : try RelayMembers(bytes: members),
                             enrolSecret: secret.isEmpty ? nil : secret)
        case .upload: return .upload(try SealedBlob(bytes: body))
        case .blob: return .blob(try SealedBlob(bytes: body))
        case .members: return .members(try RelayMembers(bytes: body))
        case .want: message = .want(try readVector(&r))
        case .join:
            let version = try r.byte("version")
            guard version == Self.version else { throw .malformed("relay protocol version \(version), this side speaks \(Self.version)") }
            message = .join(group: GroupID(bytes: try r.raw(16, "group"))!, inviter: DeviceID(bytes: try r.raw(20, "inviter"))!)
        case .joinWelcome:
            guard let key = DevicePublicKey(x963: try r.raw(65, "inviter key")) else { throw .malformed("relay joinWelcome: not a P-256 point") }
            message = .joinWelcome(inviterKey: key)
        case .joinRequest: return .joinRequest(try JoinRequest(bytes: body))
        case .keys:
            let count = try r.varint("envelope count")
            guard count <= 4096 else { throw .malformed("relay keys: \(count) envelopes") }
            message = .keys(try (0..<count).map { _ throws(SealError) in try KeyEnvelope(bytes: try r.lengthPrefixed("envelope", max: 1024)) })
        case .seen:
            let count = try r.varint("report count")
            guard count <= 4096 else { throw .malformed("relay seen: \(count) reports") }
            message = .seen(try (0..<count).map { _ throws(SealError) in
                let bytes = try r.lengthPrefixed("report", max: 1 << 20)
                do { return try SeenReport(bytes: bytes) } catch { throw .malformed("relay seen: \(error)") }
            })
        case .ping: message = .ping(try r.varint("nonce"))
        case .pong: message = .pong(try r.varint("nonce"))
        case .welcome:
            let members = try RelayMembers(bytes: try r.lengthPrefixed("members", max: 1 << 20))
            message = .welcome(members: members, blobs: try r.varint("blobs"), bytes: try r.varint("bytes"), covered: try readVector(&r))
        case .stored:
            message = .stored(replica: ReplicaID(bigEndianBytes: try r.raw(16, "replica"))!, last: try r.varint("last"),
                              snapshot: try r.byte("snapshot") == 1)
        case .caughtUp: message = .caughtUp(try r.varint("count"))
        case .refused, .notice:
            let reason = RelayRefusal(rawValue: try r.varint("reason")) ?? .other
            let text = String(decoding: try r.lengthPrefixed("text", max: Self.maxText), as: UTF8.self)
            message = kind == .refused ? .refused(reason, text) : .notice(reason, text)
        }
        guard r.isAtEnd else { throw .malformed("relay \(kind): trailing bytes") }
        return message
    }
}
