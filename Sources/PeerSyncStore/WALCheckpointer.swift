import Foundation
import GRDB
import GRDBSQLite
import Synchronization

/// Keeps SQLite's WAL checkpoints off the commit path.
///
/// SQLite's own auto-checkpoint runs inside the commit that takes the WAL past 1,000 pages: that
/// commit copies ~4 MiB into the database file and fsyncs it before it returns, and every commit
/// queued behind it waits (W2: p99 edit→visible 11–12 ms with it, 5.5–5.8 ms without).
/// A ``WALCheckpointer`` replaces it (a WAL hook replaces SQLite's auto-checkpoint) with two steps:
///
/// 1. **Bulk, in the background.** The commit that takes the WAL past ``backgroundPages`` starts a
///    PASSIVE checkpoint on a connection of its own, on a dispatch queue (never the cooperative
///    pool). PASSIVE takes no write lock: commits go on meanwhile.
/// 2. **Tail, on the writer.** A background pass cannot finish the WAL while commits keep
///    appending to it, and SQLite rewinds a WAL only when every frame is copied. So the first
///    commit after a pass checkpoints inline what was appended meanwhile (a few pages and one
///    fsync) and the next write starts the WAL from its beginning again.
///
/// If the background pass falls behind (readers pinning old frames, a slow disk), the commit that
/// finds ``inlinePages`` in the WAL checkpoints inline, as SQLite would have: the WAL stays bounded.
/// Checkpoints are best effort; a failed one is retried by a later commit and loses nothing.
///
/// Background passes are for processes that keep the store open (``background``, set by a sync
/// node's storage). A one-shot process — a `peersync` command that commits once and exits —
/// would start a pass and exit before it ends, again and again: its commits checkpoint inline
/// at ``backgroundPages``, as SQLite's auto-checkpoint did (a soak of 4,000 one-shot edits grew
/// the WAL to 10.7 MB with background passes, against 4.1 MB inline).
final class WALCheckpointer: Sendable {
    /// WAL pages at which a commit starts a background checkpoint (SQLite's auto-checkpoint default).
    static let backgroundPages: Int32 = 1_000
    /// WAL pages at which a commit checkpoints inline: the background pass is not keeping up.
    static let inlinePages: Int32 = 8_000

    /// What the checkpoints have done, for tests and diagnostics.
    struct Counts: Sendable, Equatable {
        var background = 0
        var tails = 0
        var inline = 0
        /// Largest WAL (pages) a commit reported.
        var largestWAL: Int32 = 0
        /// The WAL (pages) the last commit reported.
        var lastWAL: Int32 = 0
    }

    private struct State: Sendable {
        var running = false
        var tailDue = false
        var counts = Counts()
    }

    let path: String
    /// Whether commits hand the bulk of a checkpoint to a background pass (else they checkpoint
    /// inline at ``backgroundPages``).
    let background = Atomic<Bool>(false)
    private let state = Mutex(State())
    private let queue = DispatchQueue(label: "PeerSync WAL checkpoint", qos: .utility)

    /// Runs on the checkpoint queue after a background pass, before its result is recorded
    /// (tests: hold a pass there and commit meanwhile).
    let afterBackgroundPass = Mutex<(@Sendable () -> Void)?>(nil)

    init(path: String) { self.path = path }

    var counts: Counts { state.withLock { $0.counts } }

    /// Returns once the background pass in flight, if any, is over (tests; blocks the caller).
    func waitForBackgroundPass() { queue.sync {} }

    /// Installs the hook on a connection of the store's pool (replacing SQLite's auto-checkpoint).
    /// The pool's configuration holds `self` for as long as its connections live.
    func install(on db: Database) {
        guard let connection = db.sqliteConnection else { return }
        sqlite3_wal_hook(connection, { context, connection, _, pages in
            guard let context, let connection else { return SQLITE_OK }
            Unmanaged<WALCheckpointer>.fromOpaque(context).takeUnretainedValue().committed(connection, pages: pages)
            return SQLITE_OK
        }, Unmanaged.passUnretained(self).toOpaque())
    }

    private enum Step { case none, background, inline(tail: Bool) }

    /// Called by SQLite after each commit, write lock released, on the committing thread.
    private func committed(_ connection: OpaquePointer, pages: Int32) {
        let inBackground = background.load(ordering: .relaxed)
        let step: Step = state.withLock { state in
            state.counts.largestWAL = max(state.counts.largestWAL, pages)
            state.counts.lastWAL = pages
            if state.tailDue {
                state.tailDue = false
                return .inline(tail: true)
            }
            if pages >= Self.inlinePages || (!inBackground && pages >= Self.backgroundPages) { return .inline(tail: false) }
            if pages >= Self.backgroundPages && !state.running {
                state.running = true
                return .background
            }
            return .none
        }
        switch step {
        case .none:
            return
        case .inline(let tail):
            let code = sqlite3_wal_checkpoint_v2(connection, nil, SQLITE_CHECKPOINT_PASSIVE, nil, nil)
            if code == SQLITE_OK { state.withLock { if tail { $0.counts.tails += 1 } else { $0.counts.inline += 1 } } }
        case .background:
            queue.async { [self] in
                let done = Self.checkpoint(path)
                if let hook = afterBackgroundPass.withLock({ $0 }) { hook() }
                state.withLock { state in
                    state.running = false
                    if done {
                        state.counts.background += 1
                        state.tailDue = true
                    }
                }
            }
        }
    }

    /// A PASSIVE checkpoint on a connection of its own. Opened without `SQLITE_OPEN_CREATE`:
    /// a store deleted meanwhile is not made again as an empty file.
    private static func checkpoint(_ path: String) -> Bool {
        var connection: OpaquePointer?
        defer { sqlite3_close_v2(connection) }
        guard sqlite3_open_v2(path, &connection, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nil) == SQLITE_OK,
              let connection else { return false }
        return sqlite3_wal_checkpoint_v2(connection, nil, SQLITE_CHECKPOINT_PASSIVE, nil, nil) == SQLITE_OK
    }
}
