import Foundation
import Logging
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncReplication
import PeerSyncNetwork
import PeerSyncStore

/// Several devices of one new group made in one process, admitted by its creator directly
/// (`add` entries) instead of by invites — for tests, benchmarks and `peersync demo`, where
/// every device is at hand. Real devices join with ``Replica/invite(role:expires:)`` and
/// ``Replica/join(at:name:invite:logger:)``.
package struct LocalGroup: Sendable {
    public let groupID: GroupID
    /// One key per device; device 0 created the group.
    public let keys: [DeviceKey]
    public let names: [String]
    /// Genesis, then one `add` (as admin) per other device.
    public let entries: [RosterEntry]

    /// A group of `names.count` devices, all admins.
    public static func make(names: [String], groupName: String = "local group") throws -> LocalGroup {
        let keys = names.map { _ in DeviceKey.generate() }
        var clock = HybridLogicalClock()
        let genesis = try RosterEntry.genesis(groupName: groupName, creatorName: names[0], timestamp: clock.tick(), creator: keys[0])
        let groupID = GroupID(bytes: genesis.id.bytes)!
        var entries = [genesis]
        var previous = genesis.id
        for (key, name) in zip(keys, names).dropFirst() {
            let context = RosterEntryContext(groupID: groupID, timestamp: clock.tick(), previous: previous)
            let add = try RosterEntry.make(.add(device: key.publicKey, name: name, role: .admin), context: context, signer: keys[0])
            entries.append(add)
            previous = add.id
        }
        return LocalGroup(groupID: groupID, keys: keys, names: names, entries: entries)
    }

    /// Device `member`'s identity in the group.
    public func identity(_ member: Int) -> LocalIdentity { LocalIdentity(key: keys[member], groupID: groupID) }

    /// Writes the group's roster, and device `member`'s claim on the store's replica ID, into `store`.
    public func install(into store: ReplicaStore, member: Int) throws {
        try store.write { state in
            var delta = RecordMap.empty()
            for entry in entries where !state.contains(entry.recordKey) {
                delta.merge(state.write(entry.fields, to: entry.recordKey))
            }
            let roster = state.roster(of: groupID)
            let claim = try RosterEntry.make(.writer(state.replicaID),
                                             context: roster.context(for: keys[member].deviceID, at: state.nextTimestamp()),
                                             signer: keys[member])
            delta.merge(state.write(claim.fields, to: claim.recordKey))
            return delta
        }
        try store.setMembership(GroupMembership(groupID: groupID.bytes))
    }
}

extension Replica {
    /// A new replica at `directory` for device `member` of a ``LocalGroup`` (named `name`, or as
    /// the group names the device).
    package static func create(at directory: String, member: Int, of group: LocalGroup, name: String? = nil,
                              logger: Logger = Logger(label: "peersync", factory: { _ in SwiftLogNoOpLogHandler() })) throws -> Replica {
        let store = try ReplicaStore.create(directory: directory, name: name ?? group.names[member])
        try group.keys[member].write(to: keyPath(directory))
        try group.install(into: store, member: member)
        return try Replica(store: store, directory: directory, logger: logger)
    }
}
