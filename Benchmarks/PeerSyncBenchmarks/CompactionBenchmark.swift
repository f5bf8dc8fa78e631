import Foundation
import Logging
import PeerSync
import PeerSyncCRDT
import PeerSyncModel

/// Issue 13's workload on real stores: three devices over TLS on 127.0.0.1 create N records
/// (each a third, one batch each), converge, delete them all (each its own third), and let
/// compaction run by itself. Reported: each store's file (after returning free space) and
/// in-memory state (the encoded record map) against the same replica's while empty, and how
/// long creating and purging took.
enum CompactionBenchmark {
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

        let deleteStart = ContinuousClock.now
        for (device, replica) in replicas.enumerated() {
            try await replica.batch { batch in
                for id in ids[device] { _ = try batch.delete(ShiftType.self, id: id) }
            }
        }
        let purged = await waitUntil(patience) {
            replicas.allSatisfy { $0.state.records.invisibleRecordCount == 0 && $0.state.records.recordCount < total } && converged()
        }
        guard purged else {
            throw BenchmarkError("compaction did not purge: \(replicas.map { $0.compactionStatus().summary() })")
        }
        let deleted = milliseconds(ContinuousClock.now - deleteStart)
        // Sessions stopped first: a checkpoint cannot truncate the WAL under a running reader.
        for replica in replicas { await replica.stopSync() }
        for replica in replicas { try replica.store.returnFreeSpace() }
        let file = replicas.map { $0.store.bytesOnDisk() }
        let state = replicas.map { $0.state.records.encoded().count }
        func ratio(_ after: [Int], _ empty: [Int]) -> Double {
            zip(after, empty).map { Double($0) / Double($1) }.max() ?? 0
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
            ])
    }
}
