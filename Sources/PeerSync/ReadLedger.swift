@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import Synchronization

/// The versions of each record this replica handed to the app (fetches, queries, live
/// results), so that `save` can tell a copy that is older than a change made since it was
/// read (issue 31: an edit sheet holding a shift while a teammate changed its note, then saving
/// a new assignee, wrote the old note back on every device, with no conflict logged).
///
/// A version is the record's state as it was (shared with the replica's state, copy on write:
/// only records that changed since cost memory). Bounded: the newest ``versionsPerRecord`` per
/// record, and about ``capacity`` records (the ones handed out longest ago are forgotten first;
/// a copy of a forgotten record saves as it always did: every field that differs from now).
final class ReadLedger: Sendable {
    static let versionsPerRecord = 4
    static let capacity = 50_000

    private struct State {
        var versions: [RecordKey: [RecordState]] = [:]
        /// Keys in the order they were first handed out (for forgetting the oldest).
        var order: [RecordKey] = []
    }
    private let state = Mutex(State())

    /// `record` (as stored under `key`) was handed to the app.
    func note(_ key: RecordKey, _ record: RecordState) {
        state.withLock { s in
            if var versions = s.versions[key] {
                if versions.last?.fields == record.fields { return }
                versions.append(record)
                if versions.count > Self.versionsPerRecord { versions.removeFirst(versions.count - Self.versionsPerRecord) }
                s.versions[key] = versions
                return
            }
            s.versions[key] = [record]
            s.order.append(key)
            if s.versions.count > Self.capacity {
                let forget = s.order.prefix(Self.capacity / 2)
                for old in forget { s.versions[old] = nil }
                s.order.removeFirst(forget.count)
            }
        }
    }

    /// The fields of `writing` (what a save of a copy would write to `key`) whose value in the
    /// copy is one an earlier version handed out held, and which another replica than `local`
    /// has changed since: the copy was read before someone else's change. Each with the
    /// replica whose value it would overwrite; sorted by field.
    ///
    /// A field this replica changed itself is never stale (renaming a record back is an edit,
    /// not a stale copy). A field another device changed and the app sets back to the exact
    /// value it had before cannot be told from a stale copy: it counts as stale (the app writes
    /// such edits with `update`).
    func staleFields(of key: RecordKey, writing: [String: FieldValue], current: RecordState?,
                     local: ReplicaID) -> [(field: String, writer: ReplicaID)] {
        let versions = state.withLock { $0.versions[key] } ?? []
        guard !versions.isEmpty, let current else { return [] }
        var stale: [(field: String, writer: ReplicaID)] = []
        for (field, value) in writing {
            guard let now = current.fields[field], now.value != value, now.dot.replica != local else { continue }
            if versions.contains(where: { $0.fields[field]?.value == value }) { stale.append((field, now.dot.replica)) }
        }
        return stale.sorted { $0.field < $1.field }
    }
}
