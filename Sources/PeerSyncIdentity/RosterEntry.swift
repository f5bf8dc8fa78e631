import Crypto
@_spi(Engine) import PeerSyncCRDT

/// What a roster entry says. Each kind names who may sign it (checked when the roster is
/// evaluated, ``Roster``); the signer's key is carried by every entry, not repeated here.
package enum RosterPayload: Hashable, Sendable {
    /// Creates the group; the signer is its creator and first admin. Self-signed; the group ID is
    /// the entry's own ID.
    case genesis(groupName: String, creatorName: String)
    /// Adds a device (or changes an active device's role and name). Signed by an admin.
    case add(device: DevicePublicKey, name: String, role: DeviceRole)
    /// Removes a device for good. `dataCutoff`: for each replica ID the device writes with, the
    /// highest counter the remover had seen (later dots of that replica are refused).
    /// `rosterHeads`: the newest entries signed by the removed device that the remover had seen
    /// (the heads of its `previous` chain); the removed device's entries that are not among them
    /// or their ancestors do not count. Signed by an admin.
    case remove(device: DeviceID, dataCutoff: [ReplicaID: UInt64], rosterHeads: [RosterEntryID])
    /// Renames an active device. Signed by an admin or by the device itself.
    case rename(device: DeviceID, name: String)
    /// Opens an invite for one device with `role`, until `expiresAt` (ms since 1970). Signed by an admin.
    case invite(InviteHash, role: DeviceRole, expiresAt: UInt64)
    /// Withdraws an unused invite. Signed by an admin.
    case revokeInvite(InviteHash)
    /// A new device joins with an invite's token. Self-signed by the joiner.
    case enrol(token: InviteToken, name: String)
    /// The signer writes data as replica `replicaID`. Self-signed.
    case writer(ReplicaID)
    /// Names a group upgraded from a shared secret. Signed by the legacy key (``LegacyGroupKey``).
    case legacyGenesis(groupName: String)
    /// A device that knows the old group secret joins an upgraded group as admin. Self-signed,
    /// with `proof`: the legacy key's signature over the entry (see docs/ROSTER-DRAFT.md).
    case legacyEnrol(name: String, legacyKey: DevicePublicKey, proof: [UInt8])
    /// Ends legacy enrolment. `counted`: the legacyEnrol entries that keep counting (those the
    /// closing admin had seen); every other legacyEnrol is void. Signed by an admin.
    case closeLegacy(counted: [RosterEntryID])

    /// The entry kind, as encoded.
    public var kind: RosterEntry.Kind {
        switch self {
        case .genesis: .genesis
        case .add: .add
        case .remove: .remove
        case .rename: .rename
        case .invite: .invite
        case .revokeInvite: .revokeInvite
        case .enrol: .enrol
        case .writer: .writer
        case .legacyGenesis: .legacyGenesis
        case .legacyEnrol: .legacyEnrol
        case .closeLegacy: .closeLegacy
        }
    }
}

/// One signed, immutable entry of a group's roster. See docs/ROSTER-DRAFT.md for the bytes.
///
/// A value of this type has been decoded (or built) and checked: canonical encoding, valid
/// signature by ``signerKey``, and for legacy kinds a valid legacy proof. Whether it *counts*
/// depends on the rest of the roster (``Roster``).
package struct RosterEntry: Hashable, Sendable, CustomStringConvertible {
    /// Entry kinds and their codes.
    package enum Kind: UInt8, Hashable, Sendable, CaseIterable, CustomStringConvertible {
        case genesis = 1, add, remove, rename, invite, revokeInvite, enrol, writer, legacyGenesis, legacyEnrol, closeLegacy

        public var description: String {
            switch self {
            case .genesis: "genesis"
            case .add: "add"
            case .remove: "remove"
            case .rename: "rename"
            case .invite: "invite"
            case .revokeInvite: "revokeInvite"
            case .enrol: "enrol"
            case .writer: "writer"
            case .legacyGenesis: "legacyGenesis"
            case .legacyEnrol: "legacyEnrol"
            case .closeLegacy: "closeLegacy"
            }
        }
    }

    /// The encoding format this code writes and reads.
    public static let format: UInt8 = 1
    /// The reserved collection holding roster entries, one record each.
    public static let collection = "_roster"
    /// The one field of a roster record: `.bytes(entry bytes)`.
    public static let field = "e"
    /// Longest name (group or device), in UTF-8 bytes.
    public static let maxNameBytes = 200
    /// Most replica cutoffs, roster heads or counted legacy entries in one entry.
    public static let maxListCount = 4_096
    /// Longest encoded entry accepted (the limits above bound a valid entry to about 180 KB).
    public static let maxEntryBytes = 262_144

    static let signatureDomain = Array("peersync roster entry v1".utf8) + [0]
    static let legacyProofDomain = Array("peersync roster legacy proof v1".utf8) + [0]

    /// What the entry says.
    public let payload: RosterPayload
    /// The group it belongs to (for genesis: its own ID).
    public let groupID: GroupID
    /// The signer's hybrid logical clock when it made the entry; orders entries (``Roster``).
    public let timestamp: HLCTimestamp
    /// Who signed it.
    public let signerKey: DevicePublicKey
    /// The signer's previous entry in this group (nil for its first).
    public let previous: RosterEntryID?
    /// ECDSA P-256 signature, 64 bytes, low-S.
    public let signature: [UInt8]
    /// The canonical encoding (what is stored and synced).
    public let bytes: [UInt8]
    /// First 16 bytes of SHA-256(``bytes``); the record ID.
    public let id: RosterEntryID

    /// The entry's kind.
    public var kind: Kind { payload.kind }
    /// The signer's device ID.
    public var signer: DeviceID { signerKey.deviceID }

    public static func == (lhs: RosterEntry, rhs: RosterEntry) -> Bool { lhs.bytes == rhs.bytes }
    public func hash(into hasher: inout Hasher) { hasher.combine(id) }

    public var description: String {
        "\(kind) \(id.shortDescription) by \(signer.shortForm) at \(timestamp)"
    }

    // MARK: - Records

    /// Where the entry is stored: collection `_roster`, record ID = ``id`` as a UUID.
    public var recordKey: RecordKey { RecordKey(collection: Self.collection, id: id.uuid) }

    /// The record's fields: `e` = the entry bytes.
    public var fields: [String: FieldValue] { [Self.field: .bytes(bytes)] }

    /// Decodes a `_roster` record, checking that its ID is the hash of its bytes and that it has
    /// exactly the one field `e` holding bytes.
    public init(recordID: UUID, fields: [String: FieldValue]) throws(RosterEntryError) {
        guard fields.count == 1, case .bytes(let bytes)? = fields[Self.field] else {
            throw .badRecordFields(fields.keys.sorted())
        }
        try self.init(bytes: bytes)
        guard id.uuid == recordID else { throw .recordIDMismatch(recordID: recordID, contentID: id.uuid) }
    }

    // MARK: - Building

    /// A new group's first entry, signed by its creator.
    public static func genesis(
        groupName: String, creatorName: String, timestamp: HLCTimestamp, creator: DeviceKey
    ) throws(RosterEntryError) -> RosterEntry {
        try sign(.genesis(groupName: groupName, creatorName: creatorName), groupID: nil, timestamp: timestamp,
                 previous: nil, key: creator.privateKey)
    }

    /// A new entry of any kind but genesis, legacyGenesis and legacyEnrol (which have their own
    /// builders), signed by `signer`.
    ///
    /// - Throws: ``RosterEntryError`` if a name or list breaks the limits, or for the three
    ///   kinds above (`wrongBuilder`).
    public static func make(
        _ payload: RosterPayload, context: RosterEntryContext, signer: DeviceKey
    ) throws(RosterEntryError) -> RosterEntry {
        switch payload.kind {
        case .genesis, .legacyGenesis, .legacyEnrol: throw .wrongBuilder(payload.kind)
        default: break
        }
        return try sign(payload, groupID: context.groupID, timestamp: context.timestamp, previous: context.previous,
                        key: signer.privateKey)
    }

    /// Names an upgraded group; signed by the legacy key derived from the old group secret.
    public static func legacyGenesis(
        groupName: String, timestamp: HLCTimestamp, legacyKey: LegacyGroupKey
    ) throws(RosterEntryError) -> RosterEntry {
        try sign(.legacyGenesis(groupName: groupName), groupID: legacyKey.groupID, timestamp: timestamp, previous: nil,
                 key: legacyKey.privateKey)
    }

    /// A device that knows the old group secret enrols itself as admin of the upgraded group.
    public static func legacyEnrol(
        name: String, context: RosterEntryContext, device: DeviceKey, legacyKey: LegacyGroupKey
    ) throws(RosterEntryError) -> RosterEntry {
        guard context.groupID == legacyKey.groupID else { throw .legacyGroupMismatch }
        let placeholder = RosterPayload.legacyEnrol(name: name, legacyKey: legacyKey.publicKey, proof: [])
        try validateLimits(placeholder)
        let prefix = encodeBody(placeholder, groupID: context.groupID, timestamp: context.timestamp,
                                signer: device.publicKey, previous: context.previous)
        let proof = ECDSALowS.normalized(Array(try! legacyKey.privateKey.signature(for: legacyProofDomain + prefix).rawRepresentation))
        return try sign(.legacyEnrol(name: name, legacyKey: legacyKey.publicKey, proof: proof), groupID: context.groupID,
                        timestamp: context.timestamp, previous: context.previous, key: device.privateKey)
    }

    private static func sign(
        _ payload: RosterPayload, groupID: GroupID?, timestamp: HLCTimestamp, previous: RosterEntryID?,
        key: P256.Signing.PrivateKey
    ) throws(RosterEntryError) -> RosterEntry {
        try validateLimits(payload)
        let signer = DevicePublicKey(key.publicKey)
        let body = encodeBody(payload, groupID: payload.kind == .genesis ? nil : groupID, timestamp: timestamp,
                              signer: signer, previous: previous)
        let signature = ECDSALowS.normalized(Array(try! key.signature(for: signatureDomain + body).rawRepresentation))
        // Decoding what we built checks it exactly as a receiver will.
        return try RosterEntry(bytes: body + signature)
    }

    /// Checks names and list sizes before encoding, with errors that name the field.
    static func validateLimits(_ payload: RosterPayload) throws(RosterEntryError) {
        func check(_ name: String, _ what: String) throws(RosterEntryError) {
            if let problem = nameProblem(Array(name.utf8)) { throw .badName(what, problem) }
        }
        func checkCount(_ count: Int, _ what: String) throws(RosterEntryError) {
            if count > maxListCount { throw .tooMany(what, count) }
        }
        switch payload {
        case let .genesis(groupName, creatorName):
            try check(groupName, "group name")
            try check(creatorName, "device name")
        case let .add(_, name, _), let .rename(_, name), let .enrol(_, name), let .legacyEnrol(name, _, _):
            try check(name, "device name")
        case let .legacyGenesis(groupName):
            try check(groupName, "group name")
        case let .remove(_, cutoff, heads):
            try checkCount(cutoff.count, "replica cutoffs")
            try checkCount(Set(heads).count, "roster heads")
            if heads.contains(where: \.isZero) { throw .zeroEntryID("roster heads") }
        case let .closeLegacy(counted):
            try checkCount(Set(counted).count, "counted legacy entries")
            if counted.contains(where: \.isZero) { throw .zeroEntryID("counted legacy entries") }
        case .invite, .revokeInvite, .writer:
            break
        }
    }

    /// Why `utf8` is not an acceptable name, or nil: 1–200 bytes of UTF-8 without control characters.
    static func nameProblem(_ utf8: [UInt8]) -> String? {
        guard !utf8.isEmpty else { return "it is empty" }
        guard utf8.count <= maxNameBytes else { return "it has \(utf8.count) bytes, at most \(maxNameBytes) are allowed" }
        guard let text = String(validating: utf8, as: UTF8.self) else { return "it is not valid UTF-8" }
        if text.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) {
            return "it contains a control character"
        }
        return nil
    }

    // MARK: - Encoding

    static func encodeBody(
        _ payload: RosterPayload, groupID: GroupID?, timestamp: HLCTimestamp, signer: DevicePublicKey, previous: RosterEntryID?
    ) -> [UInt8] {
        var out: [UInt8] = [format, payload.kind.rawValue]
        if payload.kind != .genesis, let groupID { out += groupID.bytes }
        Varint.append(timestamp.rawValue, to: &out)
        out += signer.x963
        out += previous?.bytes ?? [UInt8](repeating: 0, count: RosterEntryID.byteCount)
        func string(_ s: String) {
            Varint.append(UInt64(s.utf8.count), to: &out)
            out += s.utf8
        }
        func ids(_ list: [RosterEntryID]) {
            let sorted = Set(list).sorted()
            Varint.append(UInt64(sorted.count), to: &out)
            for id in sorted { out += id.bytes }
        }
        switch payload {
        case let .genesis(groupName, creatorName):
            string(groupName)
            string(creatorName)
        case let .add(device, name, role):
            out += device.x963
            string(name)
            out.append(role.rawValue)
        case let .remove(device, cutoff, heads):
            out += device.bytes
            Varint.append(UInt64(cutoff.count), to: &out)
            for (replica, counter) in cutoff.sorted(by: { $0.key < $1.key }) {
                replica.appendBigEndianBytes(to: &out)
                Varint.append(counter, to: &out)
            }
            ids(heads)
        case let .rename(device, name):
            out += device.bytes
            string(name)
        case let .invite(hash, role, expiresAt):
            out += hash.bytes
            out.append(role.rawValue)
            Varint.append(expiresAt, to: &out)
        case let .revokeInvite(hash):
            out += hash.bytes
        case let .enrol(token, name):
            out += token.bytes
            string(name)
        case let .writer(replica):
            replica.appendBigEndianBytes(to: &out)
        case let .legacyGenesis(groupName):
            string(groupName)
        case let .legacyEnrol(name, legacyKey, proof):
            string(name)
            out += legacyKey.x963
            out += proof
        case let .closeLegacy(counted):
            ids(counted)
        }
        return out
    }
}

/// What an entry needs besides its payload: the group, the signer's timestamp, and the signer's
/// previous entry (``Roster/context(for:at:)`` fills it in).
package struct RosterEntryContext: Hashable, Sendable {
    /// The group the entry belongs to.
    public var groupID: GroupID
    /// The signer's HLC timestamp for the entry (tick the clock after observing the roster).
    public var timestamp: HLCTimestamp
    /// The signer's latest entry in this group, nil for its first.
    public var previous: RosterEntryID?

    /// A context from its parts.
    public init(groupID: GroupID, timestamp: HLCTimestamp, previous: RosterEntryID?) {
        self.groupID = groupID
        self.timestamp = timestamp
        self.previous = previous
    }
}
