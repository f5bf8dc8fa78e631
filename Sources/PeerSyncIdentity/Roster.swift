@_spi(Engine) import PeerSyncCRDT

/// The effective state of a group's roster: which devices belong, with which role, who claims
/// which replica ID, which invites are open. A pure function of the set of entries — every
/// replica holding the same entries computes the same roster, whatever order they arrived in.
///
/// ## Evaluation
/// Entries of other groups are set aside. The rest are sorted by (HLC timestamp, signer device ID,
/// entry ID) — a linear extension of causality, because a device's hybrid logical clock has
/// observed every entry it had seen when it signed — and applied one by one to the state built so
/// far. An entry counts iff its signer has the right at that point:
///
/// | kind | signer must be | effect |
/// |---|---|---|
/// | genesis | (self) | creator becomes the first admin |
/// | add | active admin | new device with a role; for an active device: new role and name |
/// | remove | active admin | device removed for good (a device never seen is banned) |
/// | rename | active admin, or the device itself | new name |
/// | invite / revokeInvite | active admin | invite opened / withdrawn |
/// | enrol | (self), with an open, unexpired, unused invite | new device with the invite's role |
/// | writer | active device (self) | claims a replica ID; the first claim wins |
/// | legacyGenesis | the legacy key | names the group (the first one counts) |
/// | legacyEnrol | (self), legacy enrolment still open | new admin |
/// | closeLegacy | active admin | legacy enrolment closed |
///
/// Rules that follow from it, each tested:
/// - **Removal is permanent and wins.** A removed (or banned) key can never be added, enrolled or
///   legacy-enrolled again. Re-adding a device presupposes having seen its removal, so the re-add
///   sorts after it and is void; a removal therefore wins over any re-add, in any order of arrival.
/// - **Mutual removal** by two admins: the removal that sorts first takes effect; the other is void
///   because its signer is no longer an admin when it is reached. One admin remains. (Equal
///   timestamps: the lower signer device ID goes first.)
/// - **A group keeps an admin**: a removal or demotion that would leave no active admin is void.
/// - **Removed devices cannot backdate.** A `remove` lists the removed device's newest entries
///   the remover had seen (`rosterHeads`); every entry signed by the removed device that is
///   neither one of those nor an ancestor of one (along `previous`) is void, whatever its
///   timestamp. Likewise a `closeLegacy` lists the legacyEnrol entries that keep counting.
///   Voiding can change what else counts, so evaluation repeats with the voided entries set
///   aside until nothing new is voided (at most one round per entry; one or two in practice).
///   The genesis entry is never voided.
///
/// Entries that do not count are kept (the roster collection is add-only) and listed in
/// ``ineffective`` with a reason, for logging.
public struct Roster: Sendable {
    /// How a device came into the group.
    package enum Origin: Hashable, Sendable {
        /// It signed the genesis entry.
        case createdGroup
        /// An admin added it.
        case added
        /// It enrolled with an invite.
        case invited(InviteHash)
        /// It proved it knew the old group secret (upgrade from a shared secret).
        case legacySecret
    }

    /// A removal (or a ban, for a device removed before it was ever a member).
    public struct Removal: Hashable, Sendable {
        /// The admin who removed the device (the first removal that counted).
        public let by: DeviceID
        /// When (the removing entry's timestamp).
        public let at: HLCTimestamp
        /// The removing entry.
        package let entry: RosterEntryID
        /// Replica ID → highest counter that still counts. Several removals of one device merge by
        /// taking the maximum per replica (what any remover had seen was already spread).
        public internal(set) var dataCutoff: [ReplicaID: UInt64]
        /// The removed device's entries the removers had seen (heads of its chain); its other entries are void.
        package internal(set) var rosterHeads: Set<RosterEntryID>
    }

    /// A device of the group, active or removed.
    public struct Device: Hashable, Sendable {
        /// Its device ID.
        public let id: DeviceID
        /// Its public key.
        package let publicKey: DevicePublicKey
        /// Its current name.
        public internal(set) var name: String
        /// Its current role (as of its removal, if removed).
        public internal(set) var role: DeviceRole
        /// How it joined.
        package let origin: Origin
        /// Who let it in: the admin who added it, or who made the invite it used; nil for the
        /// group's creator and for legacy enrolment.
        public let addedBy: DeviceID?
        /// When it joined (timestamp of the entry that brought it in).
        public let addedAt: HLCTimestamp
        /// The entry that brought it in.
        package let addedByEntry: RosterEntryID
        /// Set once it has been removed.
        public internal(set) var removal: Removal?

        /// Whether it is a member now.
        public var isActive: Bool { removal == nil }
    }

    /// An invite and what became of it.
    public struct Invite: Hashable, Sendable {
        /// Names the invite (hash of its token).
        package let hash: InviteHash
        /// The role the joiner gets.
        public let role: DeviceRole
        /// The admin who made it.
        public let createdBy: DeviceID
        /// When (timestamp of the invite entry).
        public let createdAt: HLCTimestamp
        /// Wall-clock milliseconds since 1970.
        public let expiresAt: UInt64
        /// The device that enrolled with it, if any.
        public internal(set) var usedBy: DeviceID?
        /// When it was used (the enrol entry's timestamp).
        public internal(set) var usedAt: HLCTimestamp?
        /// The admin who revoked it, if any.
        public internal(set) var revokedBy: DeviceID?
        /// When it was revoked.
        public internal(set) var revokedAt: HLCTimestamp?

        /// The status at wall-clock time `now` (ms since 1970).
        public func status(now: UInt64) -> InviteStatus {
            if let usedBy, let usedAt { return .used(by: usedBy, at: usedAt) }
            if let revokedBy, let revokedAt { return .revoked(by: revokedBy, at: revokedAt) }
            if now > expiresAt { return .expired(at: expiresAt) }
            return .open(expiresAt: expiresAt)
        }
    }

    /// Where an invite stands.
    public enum InviteStatus: Hashable, Sendable, CustomStringConvertible {
        case open(expiresAt: UInt64)
        case used(by: DeviceID, at: HLCTimestamp)
        case expired(at: UInt64)
        case revoked(by: DeviceID, at: HLCTimestamp)

        public var description: String {
            switch self {
            case .open(let expiresAt): "open until \(wallClockText(expiresAt))"
            case let .used(by, at): "already used by device \(by.shortForm) at \(wallClockText(at.physicalMilliseconds))"
            case .expired(let at): "expired at \(wallClockText(at))"
            case let .revoked(by, at): "revoked by device \(by.shortForm) at \(wallClockText(at.physicalMilliseconds))"
            }
        }
    }

    /// An entry that does not count, and why (for a log line).
    package struct IneffectiveEntry: Hashable, Sendable, CustomStringConvertible {
        /// The entry.
        public let entry: RosterEntry
        /// Why it does not count (one line).
        public let reason: String

        public var description: String {
            "roster entry \(entry.kind) \(entry.id.shortDescription) by \(entry.signer.shortForm) has no effect: \(reason)"
        }
    }

    /// Why a dot of a removed device is refused.
    package struct DotRefusal: Hashable, Sendable, CustomStringConvertible {
        /// The refused write.
        public let dot: Dot
        /// The removed device that claimed its replica.
        public let device: DeviceID
        /// The highest counter of that replica that still counts.
        public let cutoff: UInt64

        public var description: String {
            "write \(dot) is by removed device \(device.shortForm) after its cutoff (counter \(cutoff))"
        }
    }

    /// The group.
    package let groupID: GroupID
    /// Every entry of this group, by ID.
    package let entries: [RosterEntryID: RosterEntry]
    /// This group's entries in evaluation order.
    package let order: [RosterEntryID]
    /// The group's name (from genesis or the first legacyGenesis); nil until known.
    public private(set) var groupName: String?
    /// Every device that ever joined, active or removed.
    public private(set) var devices: [DeviceID: Device] = [:]
    /// Devices removed before they ever joined: they can never join.
    public private(set) var banned: [DeviceID: Removal] = [:]
    /// Replica ID → the device that claimed it first (which may since have been removed).
    public private(set) var writers: [ReplicaID: DeviceID] = [:]
    /// Replica IDs claimed by removed devices in claims that did not count (see ``refusal(of:)``).
    public private(set) var claimsOfRemovedDevices: [ReplicaID: DeviceID] = [:]
    /// Invites by hash.
    package private(set) var invites: [InviteHash: Invite] = [:]
    /// The closeLegacy entry that closed legacy enrolment, if any.
    package private(set) var legacyClosedBy: RosterEntryID?
    /// legacyEnrol entries named by the counting closeLegacy entries.
    package private(set) var countedLegacyEnrols: Set<RosterEntryID> = []
    /// Entries that do not count, in evaluation order, with reasons; also entries of other groups.
    package private(set) var ineffective: [IneffectiveEntry] = []
    /// Entries that count.
    package private(set) var effective: Set<RosterEntryID> = []
    /// Evaluation rounds the last evaluation took (1 unless entries were voided).
    public private(set) var rounds = 0

    /// Evaluates `entries` for group `groupID`. Entries of other groups are listed in
    /// ``ineffective`` and otherwise ignored; duplicates count once.
    package init(groupID: GroupID, entries: some Sequence<RosterEntry>) {
        self.groupID = groupID
        var own: [RosterEntryID: RosterEntry] = [:]
        var foreign: [IneffectiveEntry] = []
        for entry in entries {
            if entry.groupID == groupID {
                own[entry.id] = entry
            } else if !foreign.contains(where: { $0.entry.id == entry.id }) {
                foreign.append(IneffectiveEntry(entry: entry, reason: "it belongs to group \(entry.groupID), not \(groupID)"))
            }
        }
        self.entries = own
        let sorted = own.values.sorted(by: Self.evaluationOrder)
        order = sorted.map(\.id)
        var voided: [RosterEntryID: String] = [:]
        var state = Evaluation(groupID: groupID)
        for round in 1...(sorted.count + 1) {
            state = Evaluation(groupID: groupID)
            for entry in sorted { state.apply(entry, voided: voided) }
            let newlyVoided = state.impliedVoids(entries: own).filter { voided[$0.key] == nil }
            rounds = round
            if newlyVoided.isEmpty { break }
            voided.merge(newlyVoided) { old, _ in old }
        }
        groupName = state.groupName
        devices = state.devices
        banned = state.banned
        writers = state.writers
        // Claims that did not count because their signer was removed (e.g. a claim the remover
        // never saw, voided by the heads rule) still say whose writes those are, for refusing
        // them past the cutoff. The first such claim in evaluation order names the device.
        var removedClaims: [ReplicaID: DeviceID] = [:]
        for entry in sorted {
            guard case .writer(let replica) = entry.payload, state.writers[replica] == nil, removedClaims[replica] == nil,
                  state.devices[entry.signer]?.removal != nil || state.banned[entry.signer] != nil else { continue }
            removedClaims[replica] = entry.signer
        }
        claimsOfRemovedDevices = removedClaims
        invites = state.invites
        legacyClosedBy = state.legacyClosedBy
        countedLegacyEnrols = state.countedLegacyEnrols
        effective = state.effective
        ineffective = foreign + state.ineffective
    }

    /// The roster with `more` entries added (re-evaluated from scratch).
    package func adding(_ more: some Sequence<RosterEntry>) -> Roster {
        Roster(groupID: groupID, entries: Array(entries.values) + Array(more))
    }

    /// (timestamp, signer, entry ID): the evaluation order.
    static func evaluationOrder(_ a: RosterEntry, _ b: RosterEntry) -> Bool {
        if a.timestamp != b.timestamp { return a.timestamp < b.timestamp }
        if a.signer != b.signer { return a.signer < b.signer }
        return a.id < b.id
    }

    // MARK: - Queries

    /// Whether `device` is a member now (joined and not removed).
    public func isActive(_ device: DeviceID) -> Bool { devices[device]?.isActive ?? false }

    /// The role of an active device; nil if it is not active.
    public func role(of device: DeviceID) -> DeviceRole? {
        guard let d = devices[device], d.isActive else { return nil }
        return d.role
    }

    /// Active admin devices (recovery keys left out), sorted by name then ID.
    public var deviceAdmins: [Device] { activeDevices.filter { $0.role == .admin } }

    /// Active recovery keys (``DeviceRole/recovery``): not devices, so not in ``activeDevices``.
    public var recoveryKeys: [Device] {
        devices.values.filter { $0.isActive && $0.role == .recovery }.sorted { ($0.name, $0.id) < ($1.name, $1.id) }
    }

    /// Active relays (``DeviceRole/relay``): not devices, so not in ``activeDevices``.
    public var relays: [Device] {
        devices.values.filter { $0.isActive && $0.role == .relay }.sorted { ($0.name, $0.id) < ($1.name, $1.id) }
    }

    /// Active devices, sorted by name then ID (recovery keys and relays are not devices:
    /// ``recoveryKeys``, ``relays``).
    public var activeDevices: [Device] {
        devices.values.filter { $0.isActive && $0.role.isDevice }.sorted { ($0.name, $0.id) < ($1.name, $1.id) }
    }

    /// Whether `device` was removed or banned (it can never join again).
    public func isRemoved(_ device: DeviceID) -> Bool {
        banned[device] != nil || devices[device]?.removal != nil
    }

    /// The device that claimed `replica` (first claim wins), active or not; nil if none did.
    /// The caller decides what to do with writes by unclaimed replicas, or by a claimant that
    /// is not active (see ``refusal(of:)`` for removed devices' cutoffs).
    public func claimant(of replica: ReplicaID) -> DeviceID? { writers[replica] }

    /// Whether some device claims `replica`: its claim counted (``claimant(of:)``), or it was
    /// made by a device since removed and did not count (its writes are then judged by the
    /// removal's cutoff, ``refusal(of:)``). Writes by a replica no device claims are refused on
    /// receipt, except in a group upgraded from a shared secret (``isUpgradedFromSharedSecret``).
    public func isClaimed(_ replica: ReplicaID) -> Bool { writers[replica] != nil || claimsOfRemovedDevices[replica] != nil }

    /// Replica IDs claimed by devices since removed, whether their claim counted or not (a node
    /// does not dial an address where one of them is).
    public var replicasOfRemovedDevices: Set<ReplicaID> {
        var replicas = Set(claimsOfRemovedDevices.keys)
        for (replica, device) in writers where isRemoved(device) { replicas.insert(replica) }
        return replicas
    }

    /// Devices removed from the group (or banned before they joined): a node does not dial an
    /// address where a session showed one of them.
    public var removedDevices: Set<DeviceID> {
        Set(devices.keys.filter { isRemoved($0) }).union(banned.keys)
    }

    /// `removed from the group by Ana at 2026-11-20T14:03:07Z` for a removed (or banned) device
    /// (the remover's name, else its short device ID); nil for any other.
    public func removalText(of device: DeviceID) -> String? {
        guard let removal = devices[device]?.removal ?? banned[device] else { return nil }
        return "removed from the group by \(devices[removal.by]?.name ?? removal.by.shortForm) at "
            + wallClockText(removal.at.physicalMilliseconds)
    }

    /// Whether the group was upgraded from a shared secret (it holds a legacyGenesis or
    /// legacyEnrol entry; their group is checked against the legacy key when decoding, so no
    /// device can make another group look upgraded). Devices of the previous version wrote
    /// without claiming their replica IDs, and one that never upgrades never claims its ID, so
    /// such a group accepts writes by unclaimed replica IDs (docs/SECURITY.md, "A member").
    ///
    /// - Complexity: O(entries).
    public var isUpgradedFromSharedSecret: Bool {
        entries.values.contains { $0.kind == .legacyGenesis || $0.kind == .legacyEnrol }
    }

    /// Non-nil if `dot` was written by a removed device beyond its cutoff: its replica is claimed
    /// by a removed device and its counter exceeds the cutoff for that replica (0 if the
    /// removal lists none).
    package func refusal(of dot: Dot) -> DotRefusal? {
        guard let device = writers[dot.replica] ?? claimsOfRemovedDevices[dot.replica],
              let removal = devices[device]?.removal ?? banned[device] else { return nil }
        let cutoff = removal.dataCutoff[dot.replica] ?? 0
        return dot.counter > cutoff ? DotRefusal(dot: dot, device: device, cutoff: cutoff) : nil
    }

    /// Whether legacy enrolment (devices proving they know the old group secret) is closed.
    public var isLegacyEnrolmentClosed: Bool { legacyClosedBy != nil }

    /// The status of the invite `hash` at wall-clock `now` (ms since 1970); nil if there is no such invite.
    package func inviteStatus(_ hash: InviteHash, now: UInt64) -> InviteStatus? { invites[hash]?.status(now: now) }

    /// The live check when a device presents an invite token (at wall-clock `now`): nil if the
    /// invite is open, else the one line saying why not (unknown, used, expired or revoked).
    /// Use it on the member the joiner connects to; the roster's own rule compares the enrol
    /// entry's timestamp instead, which a dishonest joiner could backdate.
    package func joinRefusal(token: InviteToken, now: UInt64) -> String? {
        guard let status = inviteStatus(token.hash, now: now) else {
            return "invite \(token.hash) is unknown to this group (wrong group, or not yet synced here)"
        }
        if case .open = status { return nil }
        return "invite \(token.hash) was \(status)"
    }

    /// The heads of `device`'s chain of entries: its entries that no other entry of its names as
    /// `previous`. Sorted by evaluation order.
    package func heads(of device: DeviceID) -> [RosterEntryID] {
        let own = entries.values.filter { $0.signer == device }
        let referenced = Set(own.compactMap(\.previous))
        return own.filter { !referenced.contains($0.id) }.sorted(by: Self.evaluationOrder).map(\.id)
    }

    /// The context for a new entry signed by `signer` at `timestamp`: this group, and as
    /// `previous` the signer's latest entry (its last head in evaluation order).
    package func context(for signer: DeviceID, at timestamp: HLCTimestamp) -> RosterEntryContext {
        RosterEntryContext(groupID: groupID, timestamp: timestamp, previous: heads(of: signer).last)
    }

    /// The payload that removes `device`, as seen by a replica whose causal context is `seen`:
    /// the cutoff lists every replica the device claimed with the highest counter seen, and the
    /// roster heads are the device's heads here.
    package func removal(of device: DeviceID, seen: CausalContext) -> RosterPayload {
        var cutoff: [ReplicaID: UInt64] = [:]
        for (replica, claimant) in writers where claimant == device {
            cutoff[replica] = seen.maxCounter(of: replica)
        }
        return .remove(device: device, dataCutoff: cutoff, rosterHeads: heads(of: device))
    }

    /// The payload that closes legacy enrolment, counting the legacyEnrol entries that count now.
    package func closingLegacyEnrolment() -> RosterPayload {
        .closeLegacy(counted: entries.values.filter { $0.kind == .legacyEnrol && effective.contains($0.id) }.map(\.id))
    }
}
