@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncWire
import Synchronization

/// This node's device in its group: the key it signs with and the group it belongs to.
package struct LocalIdentity: Sendable {
    public let key: DeviceKey
    public let groupID: GroupID
    /// Set while this device has not joined yet: the inviter it trusts (named by the invite code)
    /// and the enrol entry it presents.
    public var pendingJoin: PendingJoin?
    /// A group upgraded from a shared secret keeps it to reach nodes of the previous version
    /// (TLS 1.2 with its pre-shared key), which are then told to upgrade.
    public var legacySecret: GroupSecret?

    public init(key: DeviceKey, groupID: GroupID, pendingJoin: PendingJoin? = nil, legacySecret: GroupSecret? = nil) {
        self.key = key
        self.groupID = groupID
        self.pendingJoin = pendingJoin
        self.legacySecret = legacySecret
    }
}

/// A join in progress: the inviter's device, and the signed entry that admits this device.
package struct PendingJoin: Sendable, Equatable {
    public let inviter: DeviceID
    public let entry: [UInt8]
    /// The entry is an `add` signed by a recovery key (a device recovering the group with a
    /// recovery code): no device invited it, so it presents the entry to any device of the
    /// group, and syncs with the first that admits it.
    public let isRecovery: Bool

    public init(inviter: DeviceID, entry: [UInt8]) {
        self.inviter = inviter
        self.entry = entry
        if let decoded = try? RosterEntry(bytes: entry), case .add = decoded.payload { isRecovery = true } else { isRecovery = false }
    }
}

/// Session authentication: each side signs the other's fresh nonce, so a peer proves it holds
/// the device key its hello names (on TLS the certificate's key must be the same key).
///
/// ```
/// auth signature = ECDSA-P256-SHA256, low-S, over
///   "peersync session v2" 00 ‖ signer's nonce ‖ verifier's nonce ‖ signer's replica ID ‖ group ID
/// ```
enum SessionAuth {
    static let domain = Array("peersync session v2".utf8) + [0]

    static func transcript(signerNonce: [UInt8], verifierNonce: [UInt8], signer: ReplicaID, group: [UInt8]) -> [UInt8] {
        domain + signerNonce + verifierNonce + signer.bigEndianBytes + group
    }

    static func sign(key: DeviceKey, ownNonce: [UInt8], peerNonce: [UInt8], own: ReplicaID, group: GroupID) -> [UInt8] {
        key.signature(for: transcript(signerNonce: ownNonce, verifierNonce: peerNonce, signer: own, group: group.bytes))
    }

    static func verify(_ signature: [UInt8], key: DevicePublicKey, peerNonce: [UInt8], ownNonce: [UInt8], peer: ReplicaID,
                       group: GroupID) -> Bool {
        key.isValidSignature(signature, for: transcript(signerNonce: peerNonce, verifierNonce: ownNonce, signer: peer, group: group.bytes))
    }
}

/// Who may sync: the roster's verdict on an authenticated device.
enum AdmissionVerdict: Equatable {
    /// An active device of the roster (or the inviter this device is joining through).
    case member
    /// Unknown to the roster: it may present a roster entry that admits it (`join`).
    case candidate
    case refused(CloseReason, String)
}

extension Roster {
    /// The verdict on `device` for a node whose own join is `pendingJoin`.
    func admission(of device: DeviceID, pendingJoin: PendingJoin?) -> AdmissionVerdict {
        if let pendingJoin {
            // Until its catch-up brings the roster, a joiner trusts exactly its inviter; a device
            // recovering the group, any device of it (the roster it receives proves itself from
            // the genesis, whose ID is the group ID).
            if device == pendingJoin.inviter || isActive(device) || pendingJoin.isRecovery { return .member }
            return .refused(.notAdmitted, "this device is still joining the group; it syncs with its inviter first")
        }
        if role(of: device) == .recovery {
            return .refused(.notAdmitted, "device \(device.shortForm) is a recovery key, not a device: it cannot hold a session")
        }
        if role(of: device) == .relay {
            return .refused(.notAdmitted, "device \(device.shortForm) is a relay: it speaks the relay protocol, not sync sessions")
        }
        if isActive(device) { return .member }
        if let removal = removalText(of: device) { return .refused(.deviceRemoved, "device \(device.shortForm) was \(removal)") }
        return .candidate
    }
}

extension RecordMap {
    /// This delta without the writes the roster refuses (a removed device's writes beyond its
    /// cutoff); their dots stay in the context, so they are not offered again. Returns nil if
    /// nothing is refused.
    package func strippingRefused(by roster: Roster) -> (delta: RecordMap, stripped: Int)? {
        guard !roster.devices.values.allSatisfy(\.isActive) || !roster.banned.isEmpty else { return nil }
        var stripped = 0
        var records: [(RecordKey, RecordState)] = []
        for (key, state) in allRecords {
            // The roster itself is add-only and checked by signature: its records are never dropped.
            if key.collection == RosterEntry.collection {
                records.append((key, state))
                continue
            }
            var fields = state.fields
            var presence = state.presence
            for (name, register) in state.fields where roster.refusal(of: register.dot) != nil {
                fields[name] = nil
                stripped += 1
            }
            for (writer, entry) in state.presence {
                if roster.refusal(of: Dot(replica: writer, counter: entry.counter)) != nil {
                    presence[writer] = nil
                    stripped += 1
                } else if let remover = entry.removedBy, roster.refusal(of: remover) != nil {
                    presence[writer] = PresenceEntry(counter: entry.counter, removedBy: nil)  // the add stands, the removal not
                    stripped += 1
                }
            }
            if !fields.isEmpty || !presence.isEmpty { records.append((key, RecordState(fields: fields, presence: presence))) }
        }
        guard stripped > 0 else { return nil }
        return (RecordMap(records: records, context: context, maintainingDigest: false), stripped)
    }

    /// Whether this delta writes roster entries.
    public var touchesRoster: Bool { collections[RosterEntry.collection] != nil }

    /// The first replica ID this delta names — in its context, a field's dot, a presence entry's
    /// writer or remover — that nothing vouches for, or nil. A replica ID is vouched for when a
    /// device of `roster` claims it (``Roster/isClaimed(_:)``; pass the roster *with* the
    /// delta's own roster entries, so a new device's claim and its first writes may arrive in
    /// one frame), when `known` (the receiver's context) already holds it, or when
    /// `claimedElsewhere` says so (claims in frames admitted but not yet committed). Always nil
    /// in a group upgraded from a shared secret, whose previous-version devices never claimed
    /// their IDs.
    ///
    /// - Complexity: O(dots named in the delta), plus O(roster entries) if one is unclaimed.
    package func unclaimedReplica(roster: Roster, known: CausalContext,
                                 claimedElsewhere: (ReplicaID) -> Bool = { _ in false }) -> ReplicaID? {
        var vouched: Set<ReplicaID> = []
        var unclaimed: ReplicaID?
        func check(_ replica: ReplicaID) -> Bool {
            if vouched.contains(replica) { return true }
            if known.versionVector[replica] != nil || known.dotCloud[replica] != nil || roster.isClaimed(replica)
                || claimedElsewhere(replica) {
                vouched.insert(replica)
                return true
            }
            unclaimed = replica
            return false
        }
        scan: do {
            for replica in context.versionVector.keys where !check(replica) { break scan }
            for replica in context.dotCloud.keys where !check(replica) { break scan }
            for records in collections.values {
                for state in records.values {
                    for register in state.fields.values where !check(register.dot.replica) { break scan }
                    for (writer, entry) in state.presence {
                        if !check(writer) { break scan }
                        if let remover = entry.removedBy, !check(remover.replica) { break scan }
                    }
                }
            }
        }
        guard let unclaimed, !roster.isUpgradedFromSharedSecret else { return nil }
        return unclaimed
    }
}

extension ReplicaState {
    /// The roster of `group` as this state's `_roster` records say. Records that do not decode
    /// are left out (they were refused on receipt; a local store can only hold them if damaged).
    package func roster(of group: GroupID) -> Roster {
        let entries = records.records(in: RosterEntry.collection).compactMap { id, state in
            RosterEntryCache.shared.entry(id: id, fields: state.values)
        }
        return Roster(groupID: group, entries: entries)
    }
}

/// Decoded roster entries by record ID: decoding checks an ECDSA signature, and the roster is
/// evaluated often (every change of it, every bundle), so each entry is decoded once per process.
final class RosterEntryCache: Sendable {
    static let shared = RosterEntryCache()
    private let entries = Mutex<[UUID: RosterEntry]>([:])

    func entry(id: UUID, fields: [String: FieldValue]) -> RosterEntry? {
        if let cached = entries.withLock({ $0[id] }), fields == cached.fields { return cached }
        guard let entry = try? RosterEntry(recordID: id, fields: fields) else { return nil }
        entries.withLock { cache in
            if cache.count > 100_000 { cache.removeAll() }  // bounded: a roster is far smaller
            cache[id] = entry
        }
        return entry
    }
}
