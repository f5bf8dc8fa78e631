import Crypto
@_spi(Engine) import PeerSyncCRDT

/// Reading a roster entry's bytes: the checks every received entry passes, the errors it can
/// fail with, and the strict reader they use (docs/ROSTER-DRAFT.md §3).
extension RosterEntry {
    /// Decodes and checks an entry: canonical bytes (no trailing bytes, known kind and format,
    /// lengths and counts within bounds, minimal varints, sorted lists), a valid low-S signature
    /// by the carried signer key, and for legacy kinds the legacy proof and group.
    public init(bytes: [UInt8]) throws(RosterEntryError) {
        guard bytes.count <= Self.maxEntryBytes else { throw .tooLarge(bytes.count) }
        guard bytes.count > 64 else { throw .truncated }
        let body = Array(bytes[..<(bytes.count - 64)])
        let signature = Array(bytes[(bytes.count - 64)...])
        var reader = EntryReader(body)
        let format = try reader.byte()
        guard format == Self.format else { throw .unsupportedFormat(format) }
        let kindCode = try reader.byte()
        guard let kind = Kind(rawValue: kindCode) else { throw .unknownKind(kindCode) }
        var groupID: GroupID?
        if kind != .genesis { groupID = GroupID(bytes: try reader.fixed(GroupID.byteCount))! }
        let timestamp = HLCTimestamp(rawValue: try reader.varint())
        guard let signerKey = DevicePublicKey(x963: try reader.fixed(65)) else { throw .badPublicKey("signer") }
        let previousBytes = try reader.fixed(RosterEntryID.byteCount)
        let previous = RosterEntryID(bytes: previousBytes).flatMap { $0.isZero ? nil : $0 }
        var legacyProofMessageEnd = 0
        let payload: RosterPayload
        switch kind {
        case .genesis:
            payload = .genesis(groupName: try reader.name("group name"), creatorName: try reader.name("device name"))
        case .add:
            guard let device = DevicePublicKey(x963: try reader.fixed(65)) else { throw .badPublicKey("added device") }
            payload = .add(device: device, name: try reader.name("device name"), role: try reader.role())
        case .remove:
            let device = DeviceID(bytes: try reader.fixed(DeviceID.byteCount))!
            let cutoffCount = try reader.count("replica cutoffs")
            var cutoff: [ReplicaID: UInt64] = [:]
            var last: ReplicaID?
            for _ in 0..<cutoffCount {
                let replica = ReplicaID(bigEndianBytes: try reader.fixed(16))!
                if let last, !(last < replica) { throw .notAscending("replica cutoffs") }
                last = replica
                cutoff[replica] = try reader.varint()
            }
            payload = .remove(device: device, dataCutoff: cutoff, rosterHeads: try reader.entryIDs("roster heads"))
        case .rename:
            payload = .rename(device: DeviceID(bytes: try reader.fixed(DeviceID.byteCount))!, name: try reader.name("device name"))
        case .invite:
            let hash = InviteHash(bytes: try reader.fixed(InviteHash.byteCount))!
            payload = .invite(hash, role: try reader.role(), expiresAt: try reader.varint())
        case .revokeInvite:
            payload = .revokeInvite(InviteHash(bytes: try reader.fixed(InviteHash.byteCount))!)
        case .enrol:
            payload = .enrol(token: InviteToken(bytes: try reader.fixed(InviteToken.byteCount))!, name: try reader.name("device name"))
        case .writer:
            payload = .writer(ReplicaID(bigEndianBytes: try reader.fixed(16))!)
        case .legacyGenesis:
            payload = .legacyGenesis(groupName: try reader.name("group name"))
        case .legacyEnrol:
            let name = try reader.name("device name")
            guard let legacyKey = DevicePublicKey(x963: try reader.fixed(65)) else { throw .badPublicKey("legacy key") }
            legacyProofMessageEnd = reader.offset
            payload = .legacyEnrol(name: name, legacyKey: legacyKey, proof: try reader.fixed(64))
        case .closeLegacy:
            payload = .closeLegacy(counted: try reader.entryIDs("counted legacy entries"))
        }
        guard reader.isAtEnd else { throw .trailingBytes(reader.remaining) }

        // Canonical: the one encoding of these values (catches overlong varints).
        let canonical = Self.encodeBody(payload, groupID: groupID, timestamp: timestamp, signer: signerKey, previous: previous)
        guard canonical == body else { throw .nonCanonical }
        guard signerKey.isValidSignature(signature, for: Self.signatureDomain + body) else { throw .badSignature }

        let id = RosterEntryID(hashing: bytes)
        let group = groupID ?? GroupID(bytes: id.bytes)!
        switch payload {
        case .legacyGenesis:
            guard GroupID(legacyKey: signerKey) == group else { throw .legacyGroupMismatch }
        case let .legacyEnrol(_, legacyKey, proof):
            guard GroupID(legacyKey: legacyKey) == group else { throw .legacyGroupMismatch }
            guard legacyKey.isValidSignature(proof, for: Self.legacyProofDomain + body[..<legacyProofMessageEnd]) else {
                throw .badLegacyProof
            }
            if legacyKey == signerKey { throw .signedByLegacyKey }
        default:
            if kind != .genesis, GroupID(legacyKey: signerKey) == group { throw .signedByLegacyKey }
        }
        self.payload = payload
        self.groupID = group
        self.timestamp = timestamp
        self.signerKey = signerKey
        self.previous = previous
        self.signature = signature
        self.bytes = bytes
        self.id = id
    }
}

/// Why bytes are not a roster entry, or a roster entry cannot be built. One line each.
package enum RosterEntryError: Error, Hashable, CustomStringConvertible {
    case truncated
    case tooLarge(Int)
    case trailingBytes(Int)
    case unsupportedFormat(UInt8)
    case unknownKind(UInt8)
    case badPublicKey(String)
    case badName(String, String)
    case badRole(UInt8)
    case tooMany(String, Int)
    case notAscending(String)
    case zeroEntryID(String)
    case nonCanonical
    case badSignature
    case badLegacyProof
    case legacyGroupMismatch
    case signedByLegacyKey
    case badRecordFields([String])
    case recordIDMismatch(recordID: UUID, contentID: UUID)
    case wrongBuilder(RosterEntry.Kind)

    public var description: String {
        switch self {
        case .truncated: "roster entry is truncated"
        case .tooLarge(let n): "roster entry has \(n) bytes, more than \(RosterEntry.maxEntryBytes)"
        case .trailingBytes(let n): "roster entry has \(n) unexpected bytes at its end"
        case .unsupportedFormat(let f): "roster entry has format \(f); this version reads format \(RosterEntry.format) (upgrade PeerSync)"
        case .unknownKind(let k): "roster entry has unknown kind \(k)"
        case .badPublicKey(let what): "roster entry's \(what) key is not a P-256 point"
        case let .badName(what, problem): "invalid \(what): \(problem) (1–\(RosterEntry.maxNameBytes) bytes of UTF-8, no control characters)"
        case .badRole(let r): "roster entry has unknown role \(r)"
        case let .tooMany(what, n): "roster entry lists \(n) \(what), at most \(RosterEntry.maxListCount) are allowed"
        case .notAscending(let what): "roster entry's \(what) are not in strictly ascending order"
        case .zeroEntryID(let what): "roster entry's \(what) contain the all-zero entry ID"
        case .nonCanonical: "roster entry is not in canonical form (e.g. an overlong varint)"
        case .badSignature: "roster entry's signature does not verify"
        case .badLegacyProof: "legacyEnrol entry's proof of the old group secret does not verify"
        case .legacyGroupMismatch: "legacy roster entry's group ID is not the one its legacy key gives"
        case .signedByLegacyKey: "roster entry is signed by the group's legacy key, which may only sign legacyGenesis"
        case .badRecordFields(let names): "roster record must have exactly one bytes field \"e\", has \(names)"
        case let .recordIDMismatch(recordID, contentID):
            "roster record \(recordID.uuidString) holds an entry whose ID is \(contentID.uuidString) (altered or misfiled)"
        case .wrongBuilder(let kind): "\(kind) entries have their own builder"
        }
    }
}

/// A strict reader for entry bodies; every failure is `.truncated` or a specific error.
struct EntryReader {
    private var reader: ByteReader

    init(_ bytes: [UInt8]) { reader = ByteReader(bytes) }

    var offset: Int { reader.offset }
    var isAtEnd: Bool { reader.isAtEnd }
    var remaining: Int { reader.remaining }

    mutating func byte() throws(RosterEntryError) -> UInt8 {
        guard let b = reader.readByte() else { throw .truncated }
        return b
    }

    mutating func varint() throws(RosterEntryError) -> UInt64 {
        guard let v = reader.readVarint() else { throw .truncated }
        return v
    }

    mutating func fixed(_ count: Int) throws(RosterEntryError) -> [UInt8] {
        guard let slice = reader.readBytes(count) else { throw .truncated }
        return Array(slice)
    }

    mutating func name(_ what: String) throws(RosterEntryError) -> String {
        let length = try varint()
        guard length <= UInt64(RosterEntry.maxNameBytes) else {
            throw .badName(what, "it has \(length) bytes, at most \(RosterEntry.maxNameBytes) are allowed")
        }
        let utf8 = try fixed(Int(length))
        if let problem = RosterEntry.nameProblem(utf8) { throw .badName(what, problem) }
        return String(decoding: utf8, as: UTF8.self)
    }

    mutating func role() throws(RosterEntryError) -> DeviceRole {
        let code = try byte()
        guard let role = DeviceRole(rawValue: code) else { throw .badRole(code) }
        return role
    }

    mutating func count(_ what: String) throws(RosterEntryError) -> Int {
        let n = try varint()
        guard n <= UInt64(RosterEntry.maxListCount) else { throw .tooMany(what, Int(clamping: n)) }
        return Int(n)
    }

    mutating func entryIDs(_ what: String) throws(RosterEntryError) -> [RosterEntryID] {
        let n = try count(what)
        var ids: [RosterEntryID] = []
        for _ in 0..<n {
            let id = RosterEntryID(bytes: try fixed(RosterEntryID.byteCount))!
            if id.isZero { throw .zeroEntryID(what) }
            if let last = ids.last, !(last < id) { throw .notAscending(what) }
            ids.append(id)
        }
        return ids
    }
}
