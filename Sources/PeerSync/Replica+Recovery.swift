import Foundation
import Logging
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncReplication
import PeerSyncStore

// Recovery of a group whose admin devices are lost (issue 31; docs/SECURITY.md "Recovery").
extension Replica {
    /// Makes a new recovery code for this group and returns its text, to be shown once and kept
    /// offline (printed, in a password manager): whoever holds it can enrol a new admin device
    /// (``recover(at:name:recoveryCode:logger:)``) when every admin device is lost. Admins only.
    /// The roster gets the code's public key as a recovery key (an admin's rights to sign,
    /// never a session); the recovery keys of earlier codes are removed in the same commit, so
    /// only the newest code works. Make one right after creating a group, and again after a
    /// recovery.
    public func makeRecoveryCode() async throws(ReplicaError) -> String {
        try await ReplicaError.wrapping {
            let recovery = DeviceKey.generate()
            let key = deviceKey
            let group = groupID
            try await commit { state in
                var roster = state.roster(of: group)
                guard !roster.isRemoved(key.deviceID) else { throw DeviceAdministrationError.removed }
                guard roster.role(of: key.deviceID) == .admin else {
                    throw DeviceAdministrationError.notAdmin(role: roster.role(of: key.deviceID)?.description ?? "device still joining")
                }
                var delta: RecordMap?
                func write(_ payload: RosterPayload) throws {
                    let entry = try RosterEntry.make(payload, context: roster.context(for: key.deviceID, at: state.nextTimestamp()), signer: key)
                    let change = state.write(entry.fields, to: entry.recordKey)
                    if delta == nil { delta = change } else { delta!.merge(change) }
                    roster = roster.adding([entry])
                }
                for old in roster.recoveryKeys { try write(roster.removal(of: old.id, seen: state.context)) }
                try write(.add(device: recovery.publicKey, name: "recovery key", role: .recovery))
                return delta
            }
            return RecoveryCode(groupID: group, key: recovery).text
        }
    }

    /// Enrols a new device as an admin of the group of `recoveryCode` (``makeRecoveryCode()``),
    /// at a new `directory`: for when every admin device of a group is lost. The code's key
    /// signs this device's admission; the first device of the group it meets (any: TCP, an
    /// app's transport) checks that signature against its roster, admits it, and sends it the
    /// group's data. Then make a new recovery code: this one has been used.
    ///
    /// ```swift
    /// let admin = try Replica.recover(at: path, name: "Anna's new phone", recoveryCode: typedCode)
    /// try await admin.startSync(SyncConfiguration(security: .tls, discovery: true))
    /// ```
    public static func recover(at directory: String, name: String, recoveryCode: String,
                               logger: Logger = Logger(label: "peersync", factory: { _ in SwiftLogNoOpLogHandler() })) throws(ReplicaError) -> Replica {
        let code: RecoveryCode
        do { code = try RecoveryCode(parsing: recoveryCode) } catch { throw .deviceAdministration(.invalidRecoveryCode(error.description)) }
        return try ReplicaError.wrapping {
            let store = try ReplicaStore.create(directory: directory, name: name)
            do {
                let key = try DeviceKey.create(at: keyPath(directory))
                var entryBytes: [UInt8] = []
                try store.write { state in
                    let context = RosterEntryContext(groupID: code.groupID, timestamp: state.nextTimestamp(), previous: nil)
                    let add = try RosterEntry.make(.add(device: key.publicKey, name: name, role: .admin), context: context, signer: code.key)
                    entryBytes = add.bytes
                    return state.write(add.fields, to: add.recordKey)
                }
                try store.setMembership(GroupMembership(groupID: code.groupID.bytes, joinInviter: code.key.deviceID.bytes,
                                                        joinEntry: entryBytes))
            } catch {
                try? store.close()
                try? FileManager.default.removeItem(atPath: directory)
                throw error
            }
            return try Replica(store: store, directory: directory, logger: logger)
        }
    }
}
