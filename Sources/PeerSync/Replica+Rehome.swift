import Foundation
import Logging
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncStore

// Moving a device's data to another group (issue 31): joining a team with the data a device
// already has, and leaving a group with it. Apps are used alone first and shared later.
//
// The records are not carried over as they are: their writes are dots of this device's replica
// in the old group, which the team's roster does not know (and a group's roster refuses writes
// by replica IDs no device claims). They are written again, as they read now, by a new replica
// of this device in the new group — the same record IDs, so references and attachments still
// hold. What is left behind: the old group's roster, the conflict log, the journal and the
// synced settings (the team's settings win; an app that wants its own writes them again).
// Device-local settings and attachment files stay.
//
// Crash safety: the new store is built beside the old one (DIR.rehome), then swapped in by two
// renames (DIR → DIR.left, DIR.rehome → DIR), then the attachment files move and DIR.left goes.
// Opening or joining at DIR first finishes or undoes a swap a crash interrupted.
extension Replica {
    /// Where the new group's store is built, and where the old one waits to be deleted.
    static func rehomePaths(_ directory: String) -> (staging: String, retired: String) {
        let trimmed = directory.hasSuffix("/") ? String(directory.dropLast()) : directory
        return (trimmed + ".rehome", trimmed + ".left")
    }

    /// Finishes (or undoes) a move to another group that a crash interrupted.
    static func finishInterruptedRehome(_ directory: String) throws {
        let files = FileManager.default
        let (staging, retired) = rehomePaths(directory)
        let hasStore = files.fileExists(atPath: ReplicaStore.path(in: directory))
        if !hasStore, files.fileExists(atPath: staging), files.fileExists(atPath: retired) {
            // Between the two renames: the new store is complete.
            if files.fileExists(atPath: directory) { try files.removeItem(atPath: directory) }
            try files.moveItem(atPath: staging, toPath: directory)
        }
        if files.fileExists(atPath: ReplicaStore.path(in: directory)), files.fileExists(atPath: retired) {
            moveAttachments(from: retired, to: directory)
            try files.removeItem(atPath: retired)
        }
        // A staging store beside a store that was never swapped: the move did not happen.
        if files.fileExists(atPath: ReplicaStore.path(in: directory)), files.fileExists(atPath: staging) {
            try files.removeItem(atPath: staging)
        }
    }

    private static func moveAttachments(from old: String, to new: String) {
        let files = FileManager.default
        let source = (old as NSString).appendingPathComponent("attachments")
        let target = (new as NSString).appendingPathComponent("attachments")
        guard files.fileExists(atPath: source) else { return }
        if !files.fileExists(atPath: target) {
            try? files.moveItem(atPath: source, toPath: target)
            return
        }
        for name in (try? files.contentsOfDirectory(atPath: source)) ?? [] {
            try? files.moveItem(atPath: (source as NSString).appendingPathComponent(name), toPath: (target as NSString).appendingPathComponent(name))
        }
    }

    /// Where a moved replica goes: a team it joins with an invite, or a new group of its own.
    enum Destination {
        case team(InviteCode)
        case newGroup(name: String?)
    }

    /// Moves the replica at `directory` (closed: no `Replica` of this process may have it open)
    /// to `destination`, bringing its records if `keepingData`. Returns the replica, open.
    static func rehome(_ directory: String, name: String?, to destination: Destination, keepingData: Bool,
                       logger: Logger) throws -> Replica {
        try finishInterruptedRehome(directory)
        let old = try ReplicaStore.open(directory: directory)
        let state = old.state
        let name = name ?? state.name
        let kept: [(RecordKey, [String: FieldValue])] = keepingData
            ? state.records.allRecords.filter { key, record in
                record.isVisible && !key.collection.hasPrefix("_") && key != RecordKey.syncedSettings
            }.map { ($0.0, $0.1.values) }
            : []
        let localSettings = state.localSettings
        try old.close()
        let key = try DeviceKey.load(from: keyPath(directory))

        let files = FileManager.default
        let (staging, retired) = rehomePaths(directory)
        if files.fileExists(atPath: staging) { try files.removeItem(atPath: staging) }
        let store = try ReplicaStore.create(directory: staging, name: name)
        do {
            try files.copyItem(atPath: keyPath(directory), toPath: keyPath(staging))
            switch destination {
            case .team(let invite):
                try enrol(store, name: name, invite: invite, key: key)
            case .newGroup(let groupName):
                let groupID = try startGroup(in: store, creator: key, name: name, groupName: groupName)
                try store.setMembership(GroupMembership(groupID: groupID.bytes))
            }
            try store.write { state in
                var delta: RecordMap?
                for (recordKey, fields) in kept {
                    let write = state.write(fields, to: recordKey)
                    if delta == nil { delta = write } else { delta!.merge(write) }
                }
                for (setting, value) in localSettings { state.setSetting(setting, to: value, scope: .local) }
                return delta
            }
            try store.close()
        } catch {
            try? store.close()
            try? files.removeItem(atPath: staging)
            throw error
        }
        if files.fileExists(atPath: retired) { try files.removeItem(atPath: retired) }
        try files.moveItem(atPath: directory, toPath: retired)
        try files.moveItem(atPath: staging, toPath: directory)
        try finishInterruptedRehome(directory)
        logger.debug("moved the replica to another group", metadata: ["records": "\(kept.count)", "directory": "\(directory)"])
        return try Replica(store: ReplicaStore.open(directory: directory), directory: directory, logger: logger)
    }

    /// Leaves this replica's group and keeps its data: the replica at `directory` (closed
    /// first) becomes the only device, and admin, of a new group (`groupName`, default
    /// "NAME's group") holding its records as they read now. Its old group still lists this
    /// device until an admin there removes it; what it synced there stays with that group.
    ///
    /// ```swift
    /// await replica.close()
    /// let alone = try Replica.leaveGroup(at: path)
    /// ```
    public static func leaveGroup(at directory: String, name: String? = nil, groupName: String? = nil,
                                  logger: Logger = Logger(label: "peersync", factory: { _ in SwiftLogNoOpLogHandler() })) throws(ReplicaError) -> Replica {
        try ReplicaError.wrapping {
            try rehome(directory, name: name, to: .newGroup(name: groupName), keepingData: true, logger: logger)
        }
    }
}
