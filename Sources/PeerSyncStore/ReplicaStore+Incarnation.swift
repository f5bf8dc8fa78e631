import Foundation
import GRDB
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Why and how a store's replica ID changed.
package struct IncarnationChange: Sendable, Equatable, CustomStringConvertible {
    public let previous: ReplicaID
    public let current: ReplicaID
    public let reason: String

    public var description: String {
        "continuing as replica \(current.shortDescription) (was \(previous.shortDescription)): \(reason)"
    }
}

/// One replica ID a store has written with: when it started and why.
package struct Incarnation: Sendable, Equatable {
    public let replicaID: ReplicaID
    public let startedAt: Date
    /// "created", "adopted" (a store from before incarnations), or why the ID changed.
    public let reason: String
}

/// A dot must never be issued twice. A store file copied to another machine, or put back from a
/// backup, would issue again the counters its twin or its former self already used. So a store
/// is bound to the machine and the file it lives in; when opening finds the binding broken it
/// continues under a fresh replica ID (an *incarnation*), and the old ID never writes again.
/// A restore the binding cannot see (a VM snapshot, a file overwritten in place) is caught by
/// peers: one that knows writes in this replica's name beyond what the store has makes the
/// engine call ``beginNewIncarnation(reason:)``.
extension ReplicaStore {
    /// Machine ID (Linux: /etc/machine-id) and the database file's device and inode.
    static func binding(of path: String) -> String {
        var machine = ""
        #if os(Linux)
        if let text = try? String(contentsOfFile: "/etc/machine-id", encoding: .utf8) {
            machine = text.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        #endif
        var info = stat()
        guard stat(path, &info) == 0 else { return machine }
        return "\(machine)/\(info.st_dev)/\(info.st_ino)"
    }

    /// Set when opening found the store copied or restored (the replica ID changed then).
    public var incarnationChange: IncarnationChange? { inner.withLock { $0.incarnationChange } }

    /// Every replica ID this store has written with, oldest first.
    public func incarnations() throws(StoreError) -> [Incarnation] {
        do {
            return try pool.read { db in
                try Row.fetchAll(db, sql: "SELECT replicaID, startedAt, reason FROM incarnation ORDER BY startedAt").compactMap { row in
                    guard let id = ReplicaID(hex: row[0]) else { return nil }
                    let ms: Int64 = row[1]
                    return Incarnation(replicaID: id, startedAt: Date(timeIntervalSince1970: Double(ms) / 1000), reason: row[2])
                }
            }
        } catch {
            throw StoreError.wrap(error, path: path)
        }
    }

    /// Called by `open`: a store whose binding differs from the recorded one was copied or
    /// restored, and continues under a new replica ID. A store without a recorded binding (made
    /// by an earlier version) adopts the current one.
    func checkBinding() throws(StoreError) {
        let current = Self.binding(of: path)
        let recorded: String?
        do {
            recorded = try pool.read { db in try String.fetchOne(db, sql: "SELECT binding FROM replica") }
        } catch {
            throw StoreError.wrap(error, path: path)
        }
        if recorded == current { return }
        // Both are best effort: a store that cannot be written (a read-only mount) cannot issue
        // dots either, so it cannot reuse one.
        if recorded == nil {
            try? pool.write { db in
                try db.execute(sql: "UPDATE replica SET binding = ?", arguments: [current])
                try db.execute(sql: "INSERT OR IGNORE INTO incarnation (replicaID, startedAt, reason) VALUES (?, ?, ?)",
                               arguments: [replicaID.description, Int64(HybridLogicalClock.wallClock()), "adopted"])
            }
            return
        }
        // Another process opening the same copy at the same moment may have begun the new
        // incarnation already: decided again inside the transaction (one new ID per copy).
        if let change = try? beginNewIncarnation(reason: "the store file was copied or restored (its machine or file identity changed)",
                                                 unlessBoundTo: current) {
            inner.withLock { $0.incarnationChange = change }
        }
    }

    /// Continues under a fresh replica ID: the old one never issues a dot again, so no write made
    /// from now on can collide with one the old ID made elsewhere. Other processes on the store
    /// reload (a journal marker), and so does this one.
    @discardableResult
    public func beginNewIncarnation(reason: String) throws(StoreError) -> IncarnationChange {
        try beginNewIncarnation(reason: reason, unlessBoundTo: nil)!
    }

    /// ``beginNewIncarnation(reason:)``, unless the store is already bound to `binding` when
    /// the transaction starts (another process began the incarnation): then it only reloads.
    func beginNewIncarnation(reason: String, unlessBoundTo expected: String?) throws(StoreError) -> IncarnationChange? {
        let fresh = ReplicaID.random()
        let previous = replicaID
        // A store without a file of its own has no binding (nothing to copy behind its back).
        let binding = directory == nil ? nil : Self.binding(of: path)
        var began = true
        do {
            try changingState { inner in
                try pool.write { db in
                    if let expected, try String.fetchOne(db, sql: "SELECT binding FROM replica") == expected {
                        began = false
                        return
                    }
                    try db.execute(sql: "UPDATE replica SET replicaID = ?, binding = ?", arguments: [fresh.description, binding])
                    try db.execute(sql: "INSERT INTO incarnation (replicaID, startedAt, reason) VALUES (?, ?, ?)",
                                   arguments: [fresh.description, Int64(physicalClock()), reason])
                    var marker = JournalRow(committedAt: Int64(physicalClock()), origin: "incarnation",
                                            summary: "new replica ID \(fresh.shortDescription): \(reason)", delta: nil)
                    try marker.insert(db)
                    inner.position = marker.seq ?? inner.position
                }
                inner.state = try pool.read { db in try Self.loadState(db, physicalClock: physicalClock, keeping: inner.state.conflicts) }
            }
            try flushToDisk()  // the new replica ID is durable before anything is written with it
        } catch {
            throw StoreError.wrap(error, path: path)
        }
        return began ? IncarnationChange(previous: previous, current: fresh, reason: reason) : nil
    }
}
