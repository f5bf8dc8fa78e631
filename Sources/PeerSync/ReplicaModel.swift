import Foundation
import Observation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import PeerSyncReplication
import PeerSyncNetwork
import Synchronization

/// What a SwiftUI view shows of a replica, kept current: the records of one type (filtered and
/// sorted by a ``RecordQuery``), the sync status, the connected peers and the conflicts not yet
/// resolved. An `@Observable` class on the main actor: views that read a property redraw when
/// it changes.
///
/// ```swift
/// @State private var model = ReplicaModel(replica: replica,
///                                          query: RecordQuery(Book.self, sortedBy: [KeyPathComparator(\.title)]))
/// var body: some View {
///     List(model.records) { BookRow(book: $0) }
///         .overlay { if !model.conflicts.isEmpty { ConflictBanner(model.conflicts) } }
///         .toolbar { SyncBadge(model.status, peers: model.peers) }
/// }
/// ```
///
/// Updates come from the replica's live query of `query`, ``Replica/statusUpdates()`` and
/// ``Replica/observeConflicts()``, each applied on the main actor; ``peers`` is refreshed
/// with every status change and once a second while sync runs. Everything stops when the
/// model is released (or on ``stop()``).
///
/// On Linux there is no UI run loop, but the main actor still runs whenever the program's
/// main thread is free (an `async` main, or Swift Testing): read the properties with
/// `await MainActor.run { model.records }` from other tasks.
@MainActor
@Observable
public final class ReplicaModel<Record: SyncRecord> {
    /// The records the query keeps, in its order.
    public private(set) var records: [Record] = []
    /// Whether ``records`` holds the query's first result yet.
    public private(set) var isLoaded = false
    /// Where sync stands (``Replica/statusUpdates()``).
    public private(set) var status: SyncStatus = .disabled
    /// Connected peers (empty with sync off).
    public private(set) var peers: [PeerStatus] = []
    /// Conflicts not yet marked resolved, oldest first.
    public private(set) var conflicts: [ReplicaConflict] = []
    /// The error that stopped the record or conflict updates, if one did (a stored record that
    /// does not decode as `Record`, an unreadable store).
    public private(set) var failure: String?

    /// The replica shown.
    @ObservationIgnored public nonisolated let replica: Replica
    /// The query ``records`` follows.
    @ObservationIgnored public nonisolated let query: RecordQuery<Record>
    @ObservationIgnored private nonisolated let tasks = TaskBag()

    /// A model of `replica` showing what `query` keeps (every record of the type, by ID, by
    /// default). Starts following at once.
    public init(replica: Replica, query: RecordQuery<Record> = RecordQuery()) {
        self.replica = replica
        self.query = query
        let records = replica.observe(query)
        let conflicts = replica.observeConflicts()
        let statuses = replica.statusUpdates()
        tasks.add(Task { [weak self] in
            do {
                for try await result in records {
                    guard let self else { return }
                    self.records = result
                    self.isLoaded = true
                }
            } catch {
                self?.failure = "\(error)"
            }
        })
        tasks.add(Task { [weak self] in
            do {
                for try await result in conflicts {
                    guard let self else { return }
                    self.conflicts = result
                }
            } catch {
                self?.failure = "\(error)"
            }
        })
        tasks.add(Task { [weak self] in
            for await status in statuses {
                guard let self else { return }
                self.status = status
                await self.refreshPeers()
            }
        })
        tasks.add(Task { [weak self] in
            while !Task.isCancelled {
                try? await Task.sleep(for: .seconds(1))
                guard let self else { return }
                if self.status != .disabled { await self.refreshPeers() }
            }
        })
    }

    /// A model of the records of `Record` that `isIncluded` keeps, sorted by `sortedBy`.
    public convenience init<Comparator: SortComparator & Sendable>(
        replica: Replica, where isIncluded: @escaping @Sendable (Record) -> Bool = { _ in true }, sortedBy comparators: [Comparator]
    ) where Comparator.Compared == Record {
        self.init(replica: replica, query: RecordQuery(where: isIncluded, sortedBy: comparators))
    }

    private func refreshPeers() async {
        let current = await replica.peers()
        if current.map(\.info) != peers.map(\.info) { peers = current }
    }

    /// Stops following the replica; the properties keep their last values.
    public func stop() {
        tasks.cancelAll()
    }

    deinit {
        tasks.cancelAll()
    }
}

/// Tasks to cancel together (from a deinit, which may run anywhere).
final class TaskBag: Sendable {
    private let tasks = Mutex<[Task<Void, Never>]>([])

    func add(_ task: Task<Void, Never>) {
        tasks.withLock { $0.append(task) }
    }

    func cancelAll() {
        for task in tasks.withLock({ $0 }) { task.cancel() }
    }

    deinit { cancelAll() }
}
