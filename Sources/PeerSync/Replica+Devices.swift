import Foundation
import Logging
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncReplication
import PeerSyncNetwork
import PeerSyncStore

/// Why a device operation was refused. Nothing was written.
public enum DeviceAdministrationError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Only admins add, remove and invite devices.
    case notAdmin(role: String)
    /// This device was removed from the group: it can no longer change the roster.
    case removed
    /// No device of the roster has this ID (or unique prefix).
    case unknownDevice(String)
    /// The ID prefix names several devices.
    case ambiguousDevice(String, matches: [String])
    /// The device is already removed.
    case alreadyRemoved(String)
    /// The group was not upgraded from a shared secret, or legacy enrolment is already closed.
    case noLegacyEnrolment
    /// An entry could not be built (a name too long, …).
    case invalidEntry(String)
    /// The invite cannot be revoked: it is unknown here, used, revoked or expired already.
    case inviteNotOpen(String)
    /// Demoting or removing this device would leave the group without an admin device.
    case lastAdmin(String)
    /// The text is not a recovery code (the reason says what is wrong with it).
    case invalidRecoveryCode(String)

    public var description: String {
        switch self {
        case .notAdmin(let role): "this device is a \(role), not an admin: only admins can add, remove or invite devices"
        case .removed: "this device was removed from the group; it can no longer change the roster"
        case .unknownDevice(let id): "no device \(id) in this group (see `peersync devices`)"
        case .ambiguousDevice(let id, let matches): "\(id) matches several devices: \(matches.joined(separator: ", ")); give more characters"
        case .alreadyRemoved(let id): "device \(id) is already removed"
        case .noLegacyEnrolment: "this group has no open legacy enrolment (it was not upgraded from a shared secret, or it is closed already)"
        case .invalidEntry(let detail): "invalid roster entry: \(detail)"
        case .inviteNotOpen(let reason): "nothing to revoke: \(reason)"
        case .lastAdmin(let id): "\(id) is the group's only admin device; make another device an admin first"
        case .invalidRecoveryCode(let reason): reason
        }
    }
}

/// A store's device and group, as the engine opens them.
struct DeviceSetup: Sendable {
    let key: DeviceKey
    let groupID: GroupID
    let pendingJoin: PendingJoin?
    /// An upgraded group's old secret (for legacy enrolment and for telling protocol-1 nodes to upgrade).
    let legacySecret: GroupSecret?
}

extension Replica {
    /// File names inside a store directory.
    public static let deviceKeyFile = "device-key.pem"
    public static let legacySecretFile = "group-secret"

    // MARK: - Creating and joining

    /// Creates a replica at `directory` that starts a new group: a device key, and the group's
    /// genesis entry, which makes this device its first admin.
    /// PeerSync logs to `logger` (debug and trace; warnings only for what the app must act on); by
    /// default it logs nothing.
    public static func create(at directory: String, name: String, groupName: String? = nil,
                              logger: Logger = Logger(label: "peersync", factory: { _ in SwiftLogNoOpLogHandler() })) throws(ReplicaError) -> Replica {
        try ReplicaError.wrapping { try createGroup(at: directory, name: name, groupName: groupName, logger: logger) }
    }

    private static func createGroup(at directory: String, name: String, groupName: String?, logger: Logger) throws -> Replica {
        let store = try ReplicaStore.create(directory: directory, name: name)
        do {
            let key = try DeviceKey.create(at: keyPath(directory))
            let groupID = try startGroup(in: store, creator: key, name: name, groupName: groupName)
            try store.setMembership(GroupMembership(groupID: groupID.bytes))
        } catch {
            try? FileManager.default.removeItem(atPath: directory)
            throw error
        }
        return try Replica(store: store, directory: directory, logger: logger)
    }

    /// Writes the genesis entry of a new group (`groupName`, or "`name`'s group") into `store`,
    /// which makes `creator` its first admin; returns the group's ID.
    static func startGroup(in store: ReplicaStore, creator: DeviceKey, name: String, groupName: String?) throws -> GroupID {
        var genesisID: GroupID?
        try store.write { state in
            let genesis = try RosterEntry.genesis(groupName: groupName ?? "\(name)'s group", creatorName: name,
                                                  timestamp: state.nextTimestamp(), creator: creator)
            genesisID = GroupID(bytes: genesis.id.bytes)
            return state.write(genesis.fields, to: genesis.recordKey)
        }
        return genesisID!
    }

    /// Joins the group of an invite code: at a new `directory`, a replica with a device key and
    /// the signed enrol entry it presents to its inviter at the first session; at a `directory`
    /// that holds a replica already (a device used alone first, then shared), the same, bringing
    /// its records into the team if `keepingData` (the default) or starting from the team's data
    /// if not. Sync (TCP or an app's transport) completes the join; until then this device trusts
    /// only the inviter. Close an open replica of `directory` first.
    ///
    /// ```swift
    /// await replica.close()
    /// let shared = try Replica.join(at: path, name: "Anna's iPad", invite: try InviteCode(parsing: text))
    /// ```
    ///
    /// The records are written again by this device in the new group, as they read now (same
    /// IDs, so references and attachments hold); the old group's roster, conflict log and synced
    /// settings stay behind (the team's settings win). PeerSync logs to `logger` (debug and
    /// trace; warnings only for what the app must act on); by default it logs nothing.
    public static func join(at directory: String, name: String, invite: InviteCode, keepingData: Bool = true,
                            logger: Logger = Logger(label: "peersync", factory: { _ in SwiftLogNoOpLogHandler() })) throws(ReplicaError) -> Replica {
        try ReplicaError.wrapping {
            try finishInterruptedRehome(directory)
            if FileManager.default.fileExists(atPath: ReplicaStore.path(in: directory)) {
                return try rehome(directory, name: name, to: .team(invite), keepingData: keepingData, logger: logger)
            }
            return try joinGroup(at: directory, name: name, invite: invite, logger: logger)
        }
    }

    /// Writes this device's signed enrol entry for `invite` and records the pending join it
    /// presents to its inviter at the first session (on disk and in memory alike).
    static func enrol(_ store: ReplicaStore, name: String, invite: InviteCode, key: DeviceKey) throws {
        var entryBytes: [UInt8] = []
        try store.write { state in
            let context = RosterEntryContext(groupID: invite.groupID, timestamp: state.nextTimestamp(), previous: nil)
            let enrol = try RosterEntry.make(.enrol(token: invite.token, name: name), context: context, signer: key)
            entryBytes = enrol.bytes
            return state.write(enrol.fields, to: enrol.recordKey)
        }
        try store.setMembership(GroupMembership(groupID: invite.groupID.bytes, joinInviter: invite.inviter.bytes,
                                                joinEntry: entryBytes))
    }

    private static func joinGroup(at directory: String, name: String, invite: InviteCode, logger: Logger) throws -> Replica {
        let store = try ReplicaStore.create(directory: directory, name: name)
        do {
            let key = try DeviceKey.create(at: keyPath(directory))
            try enrol(store, name: name, invite: invite, key: key)
        } catch {
            try? FileManager.default.removeItem(atPath: directory)
            throw error
        }
        return try Replica(store: store, directory: directory, logger: logger)
    }

    /// Creates a replica that joins a group of the previous version with its shared secret (a
    /// `PS1-` code): it enrols itself as an admin of the upgraded group, as every device that
    /// knows the secret may until an admin closes legacy enrolment.
    package static func join(at directory: String, name: String, legacySecret: GroupSecret,
                             logger: Logger = Logger(label: "peersync", factory: { _ in SwiftLogNoOpLogHandler() })) throws -> Replica {
        let store = try ReplicaStore.create(directory: directory, name: name)
        do {
            try writeLegacySecret(legacySecret, directory: directory)
        } catch {
            try? FileManager.default.removeItem(atPath: directory)
            throw error
        }
        return try Replica(store: store, directory: directory, logger: logger)
    }

    static func keyPath(_ directory: String) -> String { (directory as NSString).appendingPathComponent(deviceKeyFile) }

    static func writeLegacySecret(_ secret: GroupSecret, directory: String) throws {
        let path = (directory as NSString).appendingPathComponent(legacySecretFile)
        guard FileManager.default.createFile(atPath: path, contents: Data((secret.inviteCode + "\n").utf8),
                                             attributes: [.posixPermissions: 0o600]) else {
            throw StoreError.cannotOpen(path: path, detail: "cannot write the group secret")
        }
    }

    static func readLegacySecret(directory: String) throws -> GroupSecret? {
        let path = (directory as NSString).appendingPathComponent(legacySecretFile)
        guard let text = try? String(contentsOfFile: path, encoding: .utf8) else { return nil }
        return try GroupSecret(inviteCode: text.trimmingCharacters(in: .whitespacesAndNewlines))
    }

    /// The device key and group of the store at `directory`, upgrading a store made by the
    /// previous version: it gets a device key, and joins the group its shared secret determines
    /// (docs/SECURITY.md, "Upgrading from a group secret"), or starts a group of its own if it
    /// never had one.
    static func setUp(_ store: ReplicaStore, directory: String) throws -> DeviceSetup {
        let (key, _) = try DeviceKey.loadOrCreate(at: keyPath(directory))
        return try setUp(store, key: key, legacySecret: readLegacySecret(directory: directory))
    }

    /// ``setUp(_:directory:)`` with the device key and the legacy secret at hand (a replica in
    /// memory holds its key there).
    static func setUp(_ store: ReplicaStore, key: DeviceKey, legacySecret: GroupSecret?) throws -> DeviceSetup {
        if let membership = try store.membership(), let groupID = GroupID(bytes: membership.groupID) {
            var pending: PendingJoin?
            if let inviter = membership.joinInviter.flatMap(DeviceID.init(bytes:)), let entry = membership.joinEntry {
                pending = PendingJoin(inviter: inviter, entry: entry)
                if store.state.roster(of: groupID).isActive(key.deviceID) {
                    pending = nil
                    try store.setMembership(GroupMembership(groupID: groupID.bytes))
                }
            }
            try claimReplicaID(store, key: key, groupID: groupID)
            return DeviceSetup(key: key, groupID: groupID, pendingJoin: pending, legacySecret: legacySecret)
        }
        let groupID: GroupID
        if let legacySecret {
            let legacy = LegacyGroupKey(groupSecret: legacySecret.bytes)
            groupID = legacy.groupID
            try store.write { state in
                var roster = state.roster(of: groupID)
                var delta = RecordMap.empty()
                if roster.groupName == nil {
                    let genesis = try RosterEntry.legacyGenesis(groupName: "\(state.name)'s group", timestamp: state.nextTimestamp(),
                                                                legacyKey: legacy)
                    delta.merge(state.write(genesis.fields, to: genesis.recordKey))
                    roster = roster.adding([genesis])
                }
                let enrol = try RosterEntry.legacyEnrol(name: state.name, context: roster.context(for: key.deviceID, at: state.nextTimestamp()),
                                                        device: key, legacyKey: legacy)
                delta.merge(state.write(enrol.fields, to: enrol.recordKey))
                return delta
            }
        } else {
            // A library store from before groups: it starts a group of its own.
            groupID = try startGroup(in: store, creator: key, name: store.state.name, groupName: nil)
        }
        try store.setMembership(GroupMembership(groupID: groupID.bytes))
        try claimReplicaID(store, key: key, groupID: groupID)
        return DeviceSetup(key: key, groupID: groupID, pendingJoin: nil, legacySecret: legacySecret)
    }

    /// What a store put back from a backup does once it learns so (a peer's hello or auth, or a
    /// report signed by its lost future): if `lostReplica` is its current replica ID, it
    /// continues under a new one (claimed in the roster); and the writes it made under
    /// `lostReplica` after `lostSince` (ms since 1970) — since the restore — move to its current
    /// ID (docs/ARCHITECTURE.md, "Restores"). Returns the incarnation change and the events moved.
    static func recoverFromRestore(_ store: ReplicaStore, key: DeviceKey, groupID: GroupID, lostReplica: ReplicaID,
                                   lostSince: UInt64?, reason: String) throws -> (change: IncarnationChange?, moved: Int) {
        var change: IncarnationChange?
        if store.replicaID == lostReplica {
            change = try store.beginNewIncarnation(reason: reason)
            try claimReplicaID(store, key: key, groupID: groupID)
        }
        let moved = try lostSince.map { try store.moveWritesSinceRestore(of: lostReplica, after: $0) } ?? 0
        return (change, moved)
    }

    /// Makes sure the roster says this device writes as the store's current replica ID (a new
    /// store, a new incarnation after a copy or restore). Decided inside the transaction, on the
    /// latest state: two processes opening one copied store claim its new ID once.
    static func claimReplicaID(_ store: ReplicaStore, key: DeviceKey, groupID: GroupID) throws {
        func claimed(_ state: ReplicaState) -> Bool {
            state.roster(of: groupID).entries.values.contains { entry in
                if case .writer(let id) = entry.payload { return id == state.replicaID && entry.signer == key.deviceID }
                return false
            }
        }
        guard !claimed(store.state) else { return }
        try store.write { state in
            guard !claimed(state) else { return nil }
            let roster = state.roster(of: groupID)
            let entry = try RosterEntry.make(.writer(state.replicaID), context: roster.context(for: key.deviceID, at: state.nextTimestamp()),
                                             signer: key)
            return state.write(entry.fields, to: entry.recordKey)
        }
    }
}
