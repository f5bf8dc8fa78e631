/// A device's signed statement of what one of its replicas has seen: the unit of the compaction
/// gossip (docs/PROTOCOL.md §19). Compaction purges a deleted record only once every current
/// device has *signed* a report covering its deletion, so no member can make a node forget on
/// its word (issue 32); and a store that comes back from the past meets the reports its lost
/// future signed, which tells it so (issue 29, ARCHITECTURE "Restores").
///
/// ```
/// report    = body signature
/// body      = u8(1) bytes16(group ID) bytes20(device ID) bytes16(replica ID) varint(time)
///             varint(len) context-blob(len)
/// signature = bytes64: ECDSA P-256 low-S by the device's key over "peersync seen report v1" 00 ‖ body
/// ```
/// `time` (ms since 1970, the signer's clock, never lower than its previous report's + 1) is the
/// report's sequence: of two reports of one replica the later one wins. This type holds the
/// fields and the bytes; signing and verifying against the roster are in `PeerSyncIdentity`
/// (`SeenReport+Signing.swift`), which has the keys.
package struct SeenReport: Sendable, Hashable {
    /// The body's format byte.
    public static let format: UInt8 = 1
    /// What a signature signs before the body.
    public static let signingDomain: [UInt8] = Array("peersync seen report v1".utf8) + [0]
    public static let groupIDBytes = 16
    public static let deviceIDBytes = 20
    public static let signatureBytes = 64

    /// The group (16 bytes).
    public let groupID: [UInt8]
    /// The signing device (20 bytes, its device ID).
    public let device: [UInt8]
    /// The replica (one incarnation of the device's store) whose context this is.
    public let replica: ReplicaID
    /// When it was signed, ms since 1970: the report's sequence.
    public let time: UInt64
    /// What the replica had seen then.
    public let context: CausalContext
    /// 64 bytes, `r ‖ s`.
    public let signature: [UInt8]

    public init(groupID: [UInt8], device: [UInt8], replica: ReplicaID, time: UInt64, context: CausalContext, signature: [UInt8]) {
        self.groupID = groupID
        self.device = device
        self.replica = replica
        self.time = time
        self.context = context
        self.signature = signature
    }

    /// The signed part.
    public var body: [UInt8] {
        Self.body(groupID: groupID, device: device, replica: replica, time: time, context: context)
    }

    /// The body for these fields (what a signer signs, after ``signingDomain``).
    public static func body(groupID: [UInt8], device: [UInt8], replica: ReplicaID, time: UInt64, context: CausalContext) -> [UInt8] {
        var out: [UInt8] = [format]
        out += groupID
        out += device
        replica.appendBigEndianBytes(to: &out)
        Varint.append(time, to: &out)
        let blob = context.encodedBlob()
        Varint.append(UInt64(blob.count), to: &out)
        out += blob
        return out
    }

    /// The report as it travels and is stored: body, then signature.
    public var bytes: [UInt8] { body + signature }

    /// Reads ``bytes``. Refuses another format byte, wrong sizes, a time past the year 9999, a
    /// context past the context limits, non-canonical bytes (re-encoding must give the same
    /// bytes), and anything after the signature. The signature is not checked here.
    public init(bytes: [UInt8]) throws(BinaryDecodingError) {
        var index = 0
        func take(_ count: Int, _ what: String) throws(BinaryDecodingError) -> [UInt8] {
            guard count >= 0, bytes.count - index >= count else { throw .truncated("seen report: \(what)") }
            defer { index += count }
            return Array(bytes[index..<(index + count)])
        }
        func varint(_ what: String) throws(BinaryDecodingError) -> UInt64 {
            var value: UInt64 = 0
            var shift: UInt64 = 0
            while true {
                guard index < bytes.count else { throw .truncated("seen report: \(what)") }
                let byte = bytes[index]
                index += 1
                guard shift < 64 else { throw .invalid("seen report: \(what): varint too long") }
                value |= UInt64(byte & 0x7f) << shift
                if byte & 0x80 == 0 { return value }
                shift += 7
            }
        }
        guard let format = bytes.first else { throw .truncated("seen report") }
        guard format == Self.format else { throw .unsupportedVersion(format) }
        index = 1
        let group = try take(Self.groupIDBytes, "group ID")
        let device = try take(Self.deviceIDBytes, "device ID")
        guard let replica = ReplicaID(bigEndianBytes: try take(16, "replica ID")[...]) else { throw .truncated("seen report: replica ID") }
        let time = try varint("time")
        guard time <= ValidationLimits.maxPhysicalMilliseconds else { throw .invalid("seen report: time \(time) is past the year 9999") }
        let length = try varint("context length")
        guard length <= UInt64(bytes.count - index) else { throw .truncated("seen report: context") }
        let context = try CausalContext(blob: try take(Int(length), "context"))
        if let violation = context.limitViolation { throw .invalid("seen report: context: \(violation)") }
        let signature = try take(Self.signatureBytes, "signature")
        guard index == bytes.count else { throw .invalid("seen report: \(bytes.count - index) trailing bytes") }
        self.init(groupID: group, device: device, replica: replica, time: time, context: context, signature: signature)
        guard self.bytes == bytes else { throw .invalid("seen report: not in canonical form") }
    }
}

/// The newest signed report of each replica known here (PROTOCOL §19): what compaction reads.
/// Reports only replace older ones of the same replica (a later `time`); an older or equal one
/// changes nothing, so late, duplicated or reordered reports are harmless.
package struct SeenReports: Sendable, Equatable {
    /// How an offered report compares with the one held for its replica.
    package enum Offer: Sendable, Equatable {
        /// Nothing held for the replica, or an earlier report: it would replace it.
        case newer
        /// The same report again.
        case same
        /// An earlier report than the one held (a relay that has not heard the newer one yet).
        case older
        /// Another report with the same time: only a store put back from a backup signs two
        /// different reports at one time for one replica (or reports twice in one millisecond
        /// after a wall-clock step back, which the signer's floor prevents).
        case conflicting
    }

    /// replica → its newest report.
    public private(set) var byReplica: [ReplicaID: SeenReport]

    public init(_ reports: some Sequence<SeenReport> = []) {
        byReplica = [:]
        for report in reports { record(report) }
    }

    public func offer(_ report: SeenReport) -> Offer {
        guard let held = byReplica[report.replica] else { return .newer }
        if report.time > held.time { return .newer }
        if report.time < held.time { return .older }
        return report == held ? .same : .conflicting
    }

    /// Keeps `report` if it is newer than the one held for its replica; returns whether it did.
    @discardableResult
    public mutating func record(_ report: SeenReport) -> Bool {
        guard offer(report) == .newer else { return false }
        byReplica[report.replica] = report
        return true
    }

    /// Drops the reports of replicas for which `keep` is false (removed devices, older
    /// incarnations), so the map stays bounded by the roster.
    public mutating func retain(_ keep: (ReplicaID) -> Bool) {
        byReplica = byReplica.filter { keep($0.key) }
    }

    /// Each replica's reported context.
    public var contexts: [ReplicaID: CausalContext] { byReplica.mapValues(\.context) }

    public var isEmpty: Bool { byReplica.isEmpty }
    public var count: Int { byReplica.count }
    public subscript(replica: ReplicaID) -> SeenReport? { byReplica[replica] }

    /// The reports a peer that was already sent `sent` (replica → time of the report it got)
    /// has not had, leaving out those for which `skip` is true (the peer's own replica, and the
    /// replicas it has sessions with: it hears their reports from them). In replica order.
    public func news(since sent: [ReplicaID: UInt64], skipping skip: (ReplicaID) -> Bool) -> [SeenReport] {
        byReplica.values.filter { report in
            !skip(report.replica) && (sent[report.replica].map { $0 < report.time } ?? true)
        }.sorted { $0.replica < $1.replica }
    }
}

/// What recording a batch of peers' reports did.
package struct RecordedReports: Sendable, Equatable {
    /// Reports that replaced older ones (compaction may go further).
    public var grew = false
    /// Reports of this store's own replica IDs that it did not sign: its lost future's.
    public var fromLostFuture: [SeenReport] = []
    /// Set by the engine once it acted on ``fromLostFuture``: the replica ID the store wrote as
    /// before it continued under a new one (nil if its current ID did not change).
    public var leftIncarnation: ReplicaID?
    /// Events the engine moved to the current replica ID (writes made since the restore).
    public var movedEvents = 0

    public init(grew: Bool = false, fromLostFuture: [SeenReport] = []) {
        self.grew = grew
        self.fromLostFuture = fromLostFuture
    }
}
