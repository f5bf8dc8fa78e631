import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import PeerSyncStore
import ShiftSchedulerModel

func temporaryStoreDirectory() -> String {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("peersync-bench-\(UUID().uuidString)").path
    try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    return path
}

func percentile(_ sorted: [Double], _ p: Double) -> Double {
    sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))]
}

enum StoreBenchmarks {
    /// A 10k-record full state (as a new peer receives it) committed into a fresh store.
    static let fullStateCommit = Benchmark(name: "store-full-state") { quick in
        let records = quick ? 500 : 10_000
        let (source, _, _) = seededPair(records: records)
        let full = source.delta(missingFrom: CausalContext())
        var samples: [Double] = []
        var bytesPerRecord = 0.0
        for _ in 0..<(quick ? 1 : 5) {
            let dir = temporaryStoreDirectory()
            defer { try? FileManager.default.removeItem(atPath: dir) }
            let store = try! ReplicaStore.create(directory: dir, name: "fresh")
            samples.append(milliseconds(ContinuousClock().measure {
                try! store.applyRemote(full, from: "bench")
            }))
            // A new store holds its own name record: everything of the source's, not an equal digest.
            precondition(store.state.context.includes(source.context)
                         && store.state.records.records(in: ShiftType.collection).count == source.records.records(in: ShiftType.collection).count)
            bytesPerRecord = Double(store.bytesOnDisk()) / Double(records)
        }
        samples.sort()
        return Result(name: "store-full-state",
                      detail: "commit a \(records)-record full state (6 fields: id + 5) into a fresh store, one transaction",
                      metrics: ["median_ms": samples[samples.count / 2], "bytes_on_disk_per_record": bytesPerRecord])
    }

    /// Latency of one local edit: encode, one IMMEDIATE transaction, fdatasync of the WAL (our own, after the commit).
    static let editCommit = Benchmark(name: "store-edit") { quick in
        let edits = quick ? 50 : 2_000
        let dir = temporaryStoreDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try! ReplicaStore.create(directory: dir, name: "edits")
        var shift = ShiftType(symbol: "E", title: "Early", duration: 28_800)
        try! store.write { try $0.save(shift) }
        var samples: [Double] = []
        for i in 0..<edits {
            shift.title = "Early \(i)"
            let s = shift
            samples.append(milliseconds(ContinuousClock().measure { try! store.write { try $0.save(s) } }))
        }
        samples.sort()
        return Result(name: "store-edit",
                      detail: "\(edits) single-field edits, each its own committed transaction",
                      metrics: ["p50_ms": percentile(samples, 0.5), "p99_ms": percentile(samples, 0.99)])
    }

    /// What retention costs: commits into a store whose journal is full (10,000 entries), so
    /// every 64th commit also prunes 64 journal entries in its transaction; and the same
    /// one-field edit made by a fresh store instance each time (as each `peersync` command is).
    static let retention = Benchmark(name: "store-retention") { quick in
        let prefill = quick ? 200 : Int(ReplicaStore.journalLength) + 100
        let measured = quick ? 128 : 2_048
        let dir = temporaryStoreDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let store = try! ReplicaStore.create(directory: dir, name: "retention")
        let key = RecordKey(collection: ShiftType.collection, id: UUID())
        for i in 0..<prefill { try! store.write { $0.upsert(["title": .string("prefill \(i)")], to: key) } }
        var plain: [Double] = []
        var pruning: [Double] = []
        for i in 0..<measured {
            let ms = milliseconds(ContinuousClock().measure {
                try! store.write { $0.upsert(["title": .string("edit \(i)")], to: key) }
            })
            let sequence = try! store.journal(limit: 1).first!.sequence
            if sequence % ReplicaStore.pruneInterval == 0 { pruning.append(ms) } else { plain.append(ms) }
        }
        var fresh: [Double] = []
        for i in 0..<(quick ? 20 : 500) {
            fresh.append(milliseconds(ContinuousClock().measure {
                let instance = try! ReplicaStore.open(directory: dir)
                try! instance.write { $0.upsert(["title": .string("fresh \(i)")], to: key) }
            }))
        }
        let journal = try! store.journal(limit: 20_000).count
        precondition(journal <= Int(ReplicaStore.journalLength + ReplicaStore.pruneInterval))
        plain.sort(); pruning.sort(); fresh.sort()
        return Result(name: "store-retention",
                      detail: "one-field edits into a store with a full journal (every 64th commit prunes 64 entries); "
                          + "and open + edit by a fresh store instance",
                      metrics: ["commit_p50_ms": percentile(plain, 0.5), "pruning_commit_p50_ms": percentile(pruning, 0.5),
                                "pruning_commit_max_ms": pruning.last ?? 0, "fresh_instance_commit_p50_ms": percentile(fresh, 0.5),
                                "journal_rows": Double(journal)])
    }

    /// How soon a second connection (as another process would) sees a commit: the observer
    /// polls `refresh()` (PRAGMA data_version, then the journal) in a loop.
    static let crossProcess = Benchmark(name: "store-notice") { quick in
        let rounds = quick ? 20 : 500
        let dir = temporaryStoreDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let writer = try! ReplicaStore.create(directory: dir, name: "writer")
        let observer = try! ReplicaStore.open(directory: dir)
        var samples: [Double] = []
        for i in 0..<rounds {
            let location = Location(name: "L\(i)")
            try! writer.write { try $0.save(location) }
            let committed = ContinuousClock.now
            while try! observer.refresh().isEmpty {}
            samples.append(milliseconds(ContinuousClock.now - committed))
            precondition(observer.state.contains(location.recordKey))
        }
        samples.sort()
        return Result(name: "store-notice",
                      detail: "commit on one connection → seen and joined by another connection's refresh()",
                      metrics: ["p50_ms": percentile(samples, 0.5), "p99_ms": percentile(samples, 0.99)])
    }
}
