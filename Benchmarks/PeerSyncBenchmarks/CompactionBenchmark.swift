import Foundation
import Logging
import PeerSync
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import ShiftSchedulerModel

/// Issue 13's workload on real stores: three devices over TLS on 127.0.0.1 create N records
/// (each a third, one batch each), converge, delete them all (each its own third), and let
/// compaction run by itself. Reported: each store's file (after returning free space) and
/// in-memory state (the encoded record map) against the same replica's while empty, and how
/// long creating and purging took; and what the compaction gossip (`seen`, frame type 16) cost
/// each device in each phase (issue 32: signed reports).
enum CompactionBenchmark {
    /// `seen` frame bytes each replica has sent so far (TLS not included).
    static func seenBytes(_ replicas: [Replica]) async -> [Int] {
        var sent: [Int] = []
        for replica in replicas { sent.append(await replica.traffic().frameBytesSentByType[16] ?? 0) }
        return sent
    }

    static let deleteAll = Benchmark(name: "compaction-store") { quick in
        let patience: Duration = quick ? .seconds(120) : .seconds(1_200)
        let total = quick ? 600 : Int(ProcessInfo.processInfo.environment["PEERSYNC_BENCH_RECORDS"] ?? "") ?? 100_000
        let group = try LocalGroup.make(names: ["bench-a", "bench-b", "bench-c"])
        var logger = Logger(label: "bench.compaction")
        logger.logLevel = ProcessInfo.processInfo.environment["PEERSYNC_BENCH_LOG"].flatMap(Logger.Level.init(rawValue:)) ?? .error
        let directories = (0..<3).map { _ in temporaryStoreDirectory() }
        // PEERSYNC_BENCH_KEEP=1 keeps the stores for inspection (their paths are printed).
        let keep = ProcessInfo.processInfo.environment["PEERSYNC_BENCH_KEEP"] == "1"
        if keep { print("stores: \(directories.joined(separator: " "))") }
        defer { if !keep { for directory in directories { try? FileManager.default.removeItem(atPath: directory) } } }
        let replicas = try (0..<3).map { try Replica.create(at: directories[$0], member: $0, of: group, logger: logger) }
        let port = try await replicas[0].startSync(SyncConfiguration(security: .tls, listen: .loopback(0)))
        for replica in replicas.dropFirst() {
            try await replica.startSync(SyncConfiguration(security: .tls, listen: nil, peers: [.loopback(port)]))
        }
        func converged() -> Bool { Set(replicas.map { $0.state.digest }).count == 1 }
        guard await waitUntil(.seconds(120), { await replicas[0].peers().count == 2 && converged() }) else {
            throw BenchmarkError("the replicas did not connect")
        }
        // The empty replica: the group's roster and nothing else.
        for replica in replicas { try replica.store.returnFreeSpace() }
        let emptyFile = replicas.map { $0.store.bytesOnDisk() }
        let emptyState = replicas.map { $0.state.records.encoded().count }
        let seenAtStart = await seenBytes(replicas)

        let createStart = ContinuousClock.now
        var ids: [[UUID]] = []
        for (device, replica) in replicas.enumerated() {
            let mine = Array(stride(from: device, to: total, by: 3))
            var made: [UUID] = []
            try await replica.batch { batch in
                for i in mine {
                    let shift = ShiftType(symbol: "S\(i % 100)", title: "shift \(i)", duration: Double(3_600 + i % 8 * 600))
                    made.append(shift.id)
                    try batch.save(shift)
                }
            }
            ids.append(made)
        }
        guard await waitUntil(patience, { replicas.allSatisfy { $0.state.records.recordCount >= total } && converged() }) else {
            throw BenchmarkError("the replicas did not converge on \(total) records")
        }
        let created = milliseconds(ContinuousClock.now - createStart)
        let fullFile = replicas[0].store.bytesOnDisk()
        let fullState = replicas[0].state.records.encoded().count
        let seenAfterCreate = await seenBytes(replicas)

        let deleteStart = ContinuousClock.now
        for (device, replica) in replicas.enumerated() {
            try await replica.batch { batch in
                for id in ids[device] { _ = try batch.delete(ShiftType.self, id: id) }
            }
        }
        // When every replica shows no record any more (deleted, not purged yet), at most 50 ms
        // late: what purging waited for beyond that is the compaction gossip's share.
        var deletedEverywhere: Double?
        var seenAtDeleted: [Int] = []
        var lastDeletedCheck = deleteStart - .seconds(1)
        let purged = await waitUntil(patience) {
            if deletedEverywhere == nil, ContinuousClock.now - lastDeletedCheck >= .milliseconds(50) {
                lastDeletedCheck = .now
                if replicas.allSatisfy({ $0.state.records.recordCount == $0.state.records.invisibleRecordCount }) {
                    deletedEverywhere = milliseconds(ContinuousClock.now - deleteStart)
                    seenAtDeleted = await seenBytes(replicas)
                }
            }
            return replicas.allSatisfy { $0.state.records.invisibleRecordCount == 0 && $0.state.records.recordCount < total } && converged()
        }
        guard purged else {
            throw BenchmarkError("compaction did not purge: \(replicas.map { $0.compactionStatus().summary() })")
        }
        let deleted = milliseconds(ContinuousClock.now - deleteStart)
        let seenAtPurged = await seenBytes(replicas)
        let ownFrames = replicas.map { ownSeenFrameBytes($0.store) }
        let ownReports = replicas.map { ownSeenReportBytes($0.store) }
        // Sessions stopped first: a checkpoint cannot truncate the WAL under a running reader.
        for replica in replicas { await replica.stopSync() }
        for replica in replicas { try replica.store.returnFreeSpace() }
        let file = replicas.map { $0.store.bytesOnDisk() }
        let state = replicas.map { $0.state.records.encoded().count }
        func ratio(_ after: [Int], _ empty: [Int]) -> Double {
            zip(after, empty).map { Double($0) / Double($1) }.max() ?? 0
        }
        // Per device (a: the hub the other two dial; b, c): seen frame bytes sent while creating
        // and converging, from the deletes until every replica showed none, from then until
        // purged everywhere; and its own report's size (frame with it alone, report, context).
        func seenMetrics() -> [String: Double] {
            var metrics: [String: Double] = [:]
            let atDeleted = seenAtDeleted.isEmpty ? seenAtPurged : seenAtDeleted
            for (i, name) in ["a", "b", "c"].enumerated() {
                metrics["seen_bytes_create_\(name)"] = Double(seenAfterCreate[i] - seenAtStart[i])
                metrics["seen_bytes_delete_\(name)"] = Double(atDeleted[i] - seenAfterCreate[i])
                metrics["seen_bytes_purge_\(name)"] = Double(seenAtPurged[i] - atDeleted[i])
                metrics["seen_bytes_total_\(name)"] = Double(seenAtPurged[i] - seenAtStart[i])
                metrics["seen_own_frame_bytes_\(name)"] = Double(ownFrames[i])
                metrics["seen_own_report_bytes_\(name)"] = Double(ownReports[i].report)
                metrics["seen_own_context_bytes_\(name)"] = Double(ownReports[i].context)
            }
            return metrics
        }
        return Result(
            name: "compaction-store",
            detail: "3 devices over TLS create \(total) shift types (a third each, one batch), converge, delete all (own third each); "
                + "compaction runs by itself; bytes after returning free space (file incl. WAL), ratios = worst device after / empty",
            metrics: [
                "records": Double(total),
                "empty_file_bytes": Double(emptyFile[0]),
                "full_file_bytes": Double(fullFile),
                "after_file_bytes": Double(file.max() ?? 0),
                "file_ratio": ratio(file, emptyFile),
                "empty_state_bytes": Double(emptyState[0]),
                "full_state_bytes": Double(fullState),
                "after_state_bytes": Double(state.max() ?? 0),
                "state_ratio": ratio(state, emptyState),
                "create_sync_ms": created,
                "delete_purge_ms": deleted,
                "delete_visible_everywhere_ms": deletedEverywhere ?? deleted,
            ].merging(seenMetrics(), uniquingKeysWith: { $1 }))
    }
}
