import Dispatch
import Foundation
import Logging
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncStore
import Synchronization

/// Who holds compaction back and how far it got (``Replica/compactionStatus()``).
public struct CompactionStatus: Sendable, Equatable {
    /// A current device whose report lacks what the deleted records still held need.
    public struct Holder: Sendable, Equatable {
        public var device: DeviceID
        public var name: String
        /// When its report last grew here (nil: it never reported).
        public var lastSeen: Date?
    }

    /// Deleted records still held (their deletion is not stable yet).
    public var deletedRecords = 0
    /// The devices that hold the rest back, by name.
    public var heldBackBy: [Holder] = []
    /// Records this store has purged in all.
    public var purgedRecords = 0
    /// When compaction last purged something.
    public var lastRunAt: Date?
    /// Why compaction cannot run at all (this device is not an active member), if so.
    public var blocked: String?

    /// One line for people: "compaction held back by tablet, last seen 41 days ago".
    public func summary(now: Date = Date()) -> String {
        if let blocked { return "compaction off: \(blocked)" }
        if !heldBackBy.isEmpty {
            let names = heldBackBy.map { holder in
                "\(holder.name), " + (holder.lastSeen.map { "last seen \(Self.ago($0, now: now))" } ?? "never seen")
            }
            return "compaction held back by " + names.joined(separator: "; ")
        }
        if deletedRecords > 0 { return "compaction: \(deletedRecords) deleted records wait for the next round" }
        return "compaction: nothing held back (\(purgedRecords) deleted records purged in all)"
    }

    static func ago(_ date: Date, now: Date) -> String {
        let seconds = max(0, now.timeIntervalSince(date))
        if seconds >= 86_400 { let d = Int(seconds / 86_400); return "\(d) day\(d == 1 ? "" : "s") ago" }
        if seconds >= 3_600 { let h = Int(seconds / 3_600); return "\(h) hour\(h == 1 ? "" : "s") ago" }
        if seconds >= 60 { let m = Int(seconds / 60); return "\(m) minute\(m == 1 ? "" : "s") ago" }
        return "just now"
    }
}

/// What one ``Replica/compact()`` did, and what holds the rest back.
public struct CompactionReport: Sendable, Equatable {
    /// The purge (nil if nothing new was stable, so the store was not scanned).
    package var run: CompactionRun?
    public var status: CompactionStatus
}

/// The group as compaction sees it (pure): the members' views keyed by their latest replica
/// ID, which device each key is, and the removed devices' writes that members may still pass on.
struct CompactionMembers: Equatable {
    var members: [ReplicaID: MemberView] = [:]
    var devices: [ReplicaID: DeviceID] = [:]
    var departed = CausalContext()
    /// Replica IDs whose reports count (latest incarnations of active devices).
    var reporting: Set<ReplicaID> = []

    /// `reports`: what each replica reported. The local device's view is `localContext` under
    /// `localReplica`. A member's view is its latest incarnation's report (the last writer claim
    /// in roster order); a member that never claimed a replica ID has seen nothing. A removed
    /// device is no member; its writes up to its cutoff (as far as `localContext` holds them)
    /// are departed writes.
    init(roster: Roster, localDevice: DeviceID, localReplica: ReplicaID, localContext: CausalContext,
         reports: [ReplicaID: CausalContext]) {
        var claims: [DeviceID: [ReplicaID]] = [:]
        for id in roster.order {
            guard let entry = roster.entries[id], case .writer(let replica) = entry.payload,
                  let owner = roster.claimant(of: replica) else { continue }
            if !(claims[owner]?.contains(replica) ?? false) { claims[owner, default: []].append(replica) }
        }
        var unclaimed: UInt64 = 0
        // A recovery key is no device: it never syncs, so it has nothing to report.
        for device in roster.devices.values.sorted(by: { $0.id < $1.id }) where device.role.isDevice {
            let own = claims[device.id] ?? []
            if let removal = device.removal {
                var cutoff = CausalContext(versionVector: removal.dataCutoff)
                cutoff = cutoff.intersection(localContext)
                departed.merge(cutoff)
                continue
            }
            if device.id == localDevice {
                members[localReplica] = MemberView(seen: localContext, ownReplicas: Set(own + [localReplica]))
                devices[localReplica] = device.id
                continue
            }
            let key: ReplicaID
            if let latest = own.last {
                key = latest
                reporting.insert(latest)
            } else {
                unclaimed += 1
                key = ReplicaID(high: 0, low: unclaimed)  // a device that never wrote: it has seen nothing
            }
            members[key] = MemberView(seen: reports[key] ?? CausalContext(), ownReplicas: Set(own))
            devices[key] = device.id
        }
    }
}

/// Runs compaction off the engine's actor, one step at a time: after commits and gossip
/// (bounded work: the store is scanned only when the stable context grew), and on demand.
final class CompactionScheduler: Sendable {
    private let queue = DispatchQueue(label: "peersync.compaction")
    private let state = Mutex<(scheduled: Bool, again: Bool, stopped: Bool)>((false, false, false))
    /// The stable context the store was last compacted with in this process.
    let compactedWith = Mutex<CausalContext?>(nil)

    /// Runs `step` after `delay`, once for any number of triggers meanwhile; a trigger during a
    /// step runs it once more after.
    func trigger(after delay: Duration, _ step: @escaping @Sendable () -> Void) {
        let start = state.withLock { s -> Bool in
            if s.stopped { return false }
            if s.scheduled {
                s.again = true
                return false
            }
            s.scheduled = true
            return true
        }
        guard start else { return }
        let nanoseconds = max(0, delay.wholeMilliseconds) * 1_000_000
        queue.asyncAfter(deadline: .now() + .nanoseconds(Int(clamping: nanoseconds))) { [self] in
            while true {
                if state.withLock({ s in s.again = false; return s.stopped }) { return }
                step()
                let more = state.withLock { s -> Bool in
                    if s.again { return true }
                    s.scheduled = false
                    return false
                }
                if !more { return }
            }
        }
    }

    /// No step starts after this; returns once the step in progress, if any, has ended.
    func stop() async {
        state.withLock { s in
            s.stopped = true
            s.again = false
        }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            queue.async { continuation.resume() }
        }
    }

    /// Runs `body` on the compaction queue (so a step on demand never overlaps an automatic one).
    func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            queue.async { continuation.resume(with: Result { try body() }) }
        }
    }
}

extension Replica {
    /// How long after a commit or gossip an automatic compaction step runs (several triggers
    /// meanwhile make one step).
    static let compactionDelay: Duration = .milliseconds(500)

    /// Who holds compaction back now, and how far it got. Reads the state and the store's
    /// gossip; O(deleted records' elements + members).
    public nonisolated func compactionStatus() -> CompactionStatus {
        let state = store.state
        let record = store.compaction
        let roster = self.roster()
        var status = CompactionStatus()
        status.purgedRecords = record.purgedRecords
        status.lastRunAt = record.lastRunAt.map { Date(timeIntervalSince1970: Double($0) / 1_000) }
        status.deletedRecords = state.records.invisibleRecordCount
        guard roster.isActive(deviceID) else {
            status.blocked = "this device is not an active member of the group"
            return status
        }
        let group = CompactionMembers(roster: roster, localDevice: deviceID, localReplica: state.replicaID,
                                      localContext: state.context, reports: record.reportedContexts)
        let needed = state.records.unstableDeletedFrontier(stable: record.frontier.stable)
        status.heldBackBy = CompactionFrontier.holdingBack(needed, members: group.members).compactMap { key in
            guard let device = group.devices[key], let entry = roster.devices[device] else { return nil }
            return CompactionStatus.Holder(device: device, name: entry.name,
                                           lastSeen: record.reportedAt(key).map { Date(timeIntervalSince1970: Double($0) / 1_000) })
        }
        return status
    }

    /// One compaction step, now: advances the stable context from what every current device
    /// reported, drops reports that no longer count, and purges the deleted records that became
    /// stable (in batches; edits and sync go on between them). Returns what it purged and what
    /// holds the rest back. Runs off the actor; never overlaps an automatic step.
    @discardableResult
    public nonisolated func compact() async throws(ReplicaError) -> CompactionReport {
        try await ReplicaError.wrapping { try await compactionScheduler.run { try self.compactionStep(force: true) } }
    }

    /// Schedules an automatic step (after commits and gossip).
    ///
    /// The step holds the replica weakly: a replica its owner released (closed, or about to be
    /// reopened on the same files, as after a restore) must not write to its store afterwards.
    nonisolated func scheduleCompaction() {
        compactionScheduler.trigger(after: Self.compactionDelay) { [weak self] in
            guard let self else { return }
            do {
                try compactionStep(force: false)
            } catch {
                logger.debug("compaction step failed; the next commit or report retries it", metadata: ["error": "\(error)"])
            }
        }
    }

    /// The step itself (blocking: call on the compaction queue or from a command).
    /// Without `force`, the store is scanned only if the stable context grew since the last scan.
    @discardableResult
    nonisolated func compactionStep(force: Bool) throws -> CompactionReport {
        let state = store.state
        let roster = self.roster()
        guard roster.isActive(deviceID) else { return CompactionReport(run: nil, status: compactionStatus()) }
        var record = store.compaction
        let group = CompactionMembers(roster: roster, localDevice: deviceID, localReplica: state.replicaID,
                                      localContext: state.context, reports: record.reportedContexts)
        // Reports that no longer count: removed devices' and older incarnations'. Unclaimed IDs
        // stay (their claim may be on its way) unless there are absurdly many.
        let claimedElsewhere = record.reports.byReplica.keys.filter { roster.claimant(of: $0) != nil && !group.reporting.contains($0) }
        let unclaimed = record.reports.byReplica.keys.filter { roster.claimant(of: $0) == nil }
        if !claimedElsewhere.isEmpty || unclaimed.count > ValidationLimits.maxContextReplicas / 10 {
            let keep = group.reporting
            try store.retainSeen { keep.contains($0) || (unclaimed.count <= ValidationLimits.maxContextReplicas / 10 && roster.claimant(of: $0) == nil) }
        }
        var frontier = record.frontier
        let before = frontier
        // Twice: the second round may already hold with the same reports (every member has
        // seen every member's own writes), which is sound (docs/ARCHITECTURE.md).
        frontier.advance(members: group.members, departed: group.departed)
        frontier.advance(members: group.members, departed: group.departed)
        if frontier != before { try store.saveFrontier(frontier) }
        record = store.compaction
        let stable = record.frontier.stable
        var run: CompactionRun?
        let last = compactionScheduler.compactedWith.withLock { $0 }
        if !stable.isEmpty, force || last.map({ !$0.includes(stable) }) ?? true {
            let result = try store.compact(stable: stable)
            compactionScheduler.compactedWith.withLock { $0 = stable }
            if result.purgedRecords > 0 {
                logger.debug("compaction purged deleted records", metadata: [
                    "compaction.purged": "\(result.purgedRecords)", "compaction.remaining": "\(result.remainingDeleted)",
                    "compaction.bytes.before": "\(result.bytesBefore)", "compaction.bytes.after": "\(result.bytesAfter)",
                ])
            }
            run = result
            // Connected peers hear of it with the next digest round (PROTOCOL §19.4).
            if result.purgedRecords > 0 { Task { [weak self] in await self?.announceCompaction() } }
        }
        return CompactionReport(run: run, status: compactionStatus())
    }

    /// Tells the sessions that a compaction step purged records.
    func announceCompaction() async {
        await replicator?.compacted()
        // Relays get a snapshot of the compacted state and drop every blob it covers: their
        // storage follows the live data too.
        await uploadRelaySnapshot()
    }
}
