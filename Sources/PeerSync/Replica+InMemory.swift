import Foundation
import Logging
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncStore

/// Replicas held in memory only, for SwiftUI previews and app tests: no directory, no file.
///
/// Everything works as on a replica opened at a path — save, fetch, batches, live queries,
/// ``Replica/changes()``, settings, conflicts, sync over an app transport
/// (``Replica/openSession(address:initiator:)``) or TCP, invites and joins — except:
/// - the replica, its data and its device key are gone when it is released (the key is made
///   for it and never written anywhere);
/// - there are no other processes to watch (``Replica/watchOtherProcesses()`` returns at once);
///   nothing is fsynced, no WAL is checkpointed, and copies or restores of a file cannot
///   happen, so none is looked for;
/// - attachment bytes need files: they go to a temporary directory (``ReplicaStore/filesDirectory``),
///   made on the first attachment added or received and removed when the replica's store is
///   released. A replica that adds no attachment writes no file at all.
extension Replica {
    /// A new replica in memory that starts a new group (named `groupName`, default
    /// "`name`'s group") of which this device — with a new key held in memory — is the first
    /// admin. See the extension's comment for what differs from a replica on disk.
    ///
    /// ```swift
    /// #Preview {
    ///     let replica = try! Replica.inMemory(name: "Preview")
    ///     ContentView(model: ReplicaModel(replica: replica, query: RecordQuery(ShiftType.self)))
    /// }
    /// ```
    public static func inMemory(name: String = "In memory", groupName: String? = nil,
                                logger: Logger = Logger(label: "peersync", factory: { _ in SwiftLogNoOpLogHandler() })) throws(ReplicaError) -> Replica {
        try ReplicaError.wrapping { try makeInMemory(name: name, groupName: groupName, logger: logger) }
    }

    private static func makeInMemory(name: String, groupName: String?, logger: Logger) throws -> Replica {
        let store = try ReplicaStore.inMemory(name: name)
        let key = DeviceKey.generate()
        let groupID = try startGroup(in: store, creator: key, name: name, groupName: groupName)
        try store.setMembership(GroupMembership(groupID: groupID.bytes))
        return try Replica(store: store, key: key, logger: logger)
    }

    /// A new replica in memory that joins a group with an invite code (``invite(role:expires:)``
    /// on an admin's replica): a key held in memory and the signed enrol entry it presents to
    /// its inviter at the first session, which completes the join — as
    /// ``join(at:name:invite:logger:)`` does on disk.
    public static func inMemory(name: String, invite: InviteCode, logger: Logger = Logger(label: "peersync", factory: { _ in SwiftLogNoOpLogHandler() })) throws(ReplicaError) -> Replica {
        try ReplicaError.wrapping { try makeInMemory(name: name, invite: invite, logger: logger) }
    }

    private static func makeInMemory(name: String, invite: InviteCode, logger: Logger) throws -> Replica {
        let store = try ReplicaStore.inMemory(name: name)
        let key = DeviceKey.generate()
        try enrol(store, name: name, invite: invite, key: key)
        return try Replica(store: store, key: key, logger: logger)
    }

    /// A new replica in memory for device `member` of a ``LocalGroup`` (named `name`, or as the
    /// group names the device): its devices are admitted already, no invite needed.
    package static func inMemory(member: Int, of group: LocalGroup, name: String? = nil,
                                 logger: Logger = Logger(label: "peersync", factory: { _ in SwiftLogNoOpLogHandler() })) throws -> Replica {
        guard group.keys.indices.contains(member) else {
            throw DeviceAdministrationError.invalidEntry("no device \(member) in a local group of \(group.keys.count)")
        }
        let store = try ReplicaStore.inMemory(name: name ?? group.names[member])
        try group.install(into: store, member: member)
        return try Replica(store: store, key: group.keys[member], logger: logger)
    }

    /// Whether this replica is held in memory only (``inMemory(name:groupName:logger:)``):
    /// it has no directory, and is gone when released.
    public nonisolated var isInMemory: Bool { directory.isEmpty }
}
