import Foundation
import GRDB

/// Which sync group a replica belongs to, and the join it has not completed yet. The store keeps
/// the bytes; the engine gives them meaning (PeerSyncIdentity).
package struct GroupMembership: Sendable, Equatable {
    /// The group ID (16 bytes).
    public var groupID: [UInt8]
    /// While joining: the inviter's device ID (20 bytes) and the entry this device presents.
    public var joinInviter: [UInt8]?
    public var joinEntry: [UInt8]?

    public init(groupID: [UInt8], joinInviter: [UInt8]? = nil, joinEntry: [UInt8]? = nil) {
        self.groupID = groupID
        self.joinInviter = joinInviter
        self.joinEntry = joinEntry
    }
}

extension ReplicaStore {
    /// The group this replica belongs to, or nil for a store made before groups had IDs (an
    /// upgrade: the engine derives the ID from the old group secret and records it).
    public func membership() throws(StoreError) -> GroupMembership? {
        do {
            return try pool.read { db in
                guard let row = try Row.fetchOne(db, sql: "SELECT groupID, joinInviter, joinEntry FROM replica"),
                      let group: Data = row["groupID"] else { return nil }
                let inviter: Data? = row["joinInviter"]
                let entry: Data? = row["joinEntry"]
                return GroupMembership(groupID: Array(group), joinInviter: inviter.map(Array.init), joinEntry: entry.map(Array.init))
            }
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }

    /// Records the group (and a join in progress, or its end with nil join fields).
    public func setMembership(_ membership: GroupMembership) throws(StoreError) {
        do {
            try pool.write { db in
                try db.execute(sql: "UPDATE replica SET groupID = ?, joinInviter = ?, joinEntry = ?", arguments: [
                    Data(membership.groupID), membership.joinInviter.map { Data($0) }, membership.joinEntry.map { Data($0) },
                ])
            }
            try flushToDisk()
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }
}
