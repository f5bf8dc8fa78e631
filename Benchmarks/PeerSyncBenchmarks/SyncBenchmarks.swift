import Foundation
import Logging
import PeerSync
import PeerSyncWire
import ShiftSchedulerModel

/// A node with a fresh store in a temporary directory, on 127.0.0.1 with real TLS.
struct BenchNode {
    let directory: String
    let store: ReplicaStore
    let node: SyncNode
    var port: UInt16 = 0

    init(_ name: String, secret: BenchGroup) throws {
        directory = temporaryStoreDirectory()
        store = try ReplicaStore.create(directory: directory, name: name)
        var logger = Logger(label: "bench.\(name)")
        logger.logLevel = .error
        node = try SyncNode(storage: StoreSyncStorage(store), replicaID: store.replicaID, name: name, identity: try secret.admit(store),
                            configuration: SyncConfiguration(security: .tls, listen: .loopback(0)), logger: logger)
    }

    mutating func start() async throws { port = try await node.start() }

    func stop() async {
        await node.stop()
        try? FileManager.default.removeItem(atPath: directory)
    }
}

/// Six-field shift-type records as the workloads define them: id (the key), symbol 1–3 letters,
/// title ~12 characters, duration integer, description ~40 characters, locationID UUID.
func workloadRecord(_ i: Int, _ rng: inout some RandomNumberGenerator) -> [String: FieldValue] {
    let letters = Array("ABCDEFGHJKLMNPRSTUVWXYZ")
    let symbol = String((0..<Int.random(in: 1...3, using: &rng)).map { _ in letters.randomElement(using: &rng)! })
    return [
        "symbol": .string(symbol),
        "title": .string("Shift \(String(i, radix: 36).uppercased())".padding(toLength: 12, withPad: "x", startingAt: 0)),
        "duration": .int(Int64([21_600, 28_800, 36_000, 43_200].randomElement(using: &rng)!)),
        "description": .string("Covers ward \(i % 40) with handover at the start."),
        "locationID": .uuid(UUID()),
    ]
}

func fill(_ store: ReplicaStore, records: Int, seed: UInt64) throws {
    var rng = BenchRNG(state: seed)
    try store.write { state in
        var delta = RecordMap()
        for i in 0..<records {
            delta.merge(state.write(workloadRecord(i, &rng), to: RecordKey(collection: ShiftType.collection, id: UUID())))
        }
        return delta
    }
}

enum SyncBenchmarks {
    /// Edit on A → committed on B and reported; one edit at a time, so every delta travels alone.
    static let latency = Benchmark(name: "sync-latency") { quick in
        let edits = quick ? 30 : 2_000
        let secret = BenchGroup()
        var a = try BenchNode("a", secret: secret)
        var b = try BenchNode("b", secret: secret)
        try fill(a.store, records: 1_000, seed: 1)
        try await a.start()
        try await b.start()
        let events = b.node.events()
        await b.node.addPeer(.loopback(a.port))
        var iterator = events.makeAsyncIterator()
        while let event = await iterator.next() {
            if case .converged = event { break }
        }
        let keys = Array(a.store.state.records.records(in: ShiftType.collection).keys)
        let before = await b.node.traffic()
        var samples: [Double] = []
        var rng = BenchRNG(state: 9)
        for i in 0..<edits {
            let key = RecordKey(collection: ShiftType.collection, id: keys.randomElement(using: &rng)!)
            let start = ContinuousClock.now
            // The node ships every commit to the store (it follows the commit feed).
            try a.store.write { $0.upsert(["duration": .int(Int64(20_000 + i))], to: key) }
            waiting: while let event = await iterator.next() {
                if case .remoteChange(let outcome, _) = event, outcome.changedRecords.contains(key) { break waiting }
            }
            samples.append(milliseconds(ContinuousClock.now - start))
        }
        let after = await b.node.traffic()
        samples.sort()
        await a.stop()
        await b.stop()
        return Result(name: "sync-latency",
                      detail: "\(edits) one-field edits on A, each committed on A, sent, committed on B (TLS, loopback)",
                      metrics: ["p50_ms": percentile(samples, 0.5), "p99_ms": percentile(samples, 0.99),
                                "wire_bytes_per_update": Double(after.bytesReceived - before.bytesReceived) / Double(edits)])
    }

    /// A fresh peer receives the full state: from connect to every chunk committed.
    static let initialSync = Benchmark(name: "sync-initial") { quick in
        var metrics: [String: Double] = [:]
        // PEERSYNC_BENCH_RECORDS=N runs one size only (for profiling).
        let sizes = ProcessInfo.processInfo.environment["PEERSYNC_BENCH_RECORDS"].flatMap(Int.init).map { [$0] }
        for records in sizes ?? (quick ? [500] : [10_000, 100_000]) {
            let secret = BenchGroup()
            var a = try BenchNode("a", secret: secret)
            var b = try BenchNode("b", secret: secret)
            try fill(a.store, records: records, seed: 2)
            try await a.start()
            try await b.start()
            // What a's extraction for b costs alone (b's context: its own roster entries).
            let bContext = b.store.state.context
            let aState = a.store.state
            metrics["\(records)_extract_ms"] = milliseconds(ContinuousClock().measure { _ = aState.delta(missingFrom: bContext) })
            // Where the time goes: connect → first chunk in → last chunk in → committed.
            let marks = Locked<(connected: ContinuousClock.Instant?, first: ContinuousClock.Instant?, last: ContinuousClock.Instant?)>((nil, nil, nil))
            let events = b.node.events()
            let watcher = Task {
                for await event in events {
                    let now = ContinuousClock.now
                    if case .peerConnected = event { marks.withLock { $0.connected = $0.connected ?? now } }
                    guard case .catchUpProgress(_, let chunk, let chunks, _) = event else { continue }
                    marks.withLock { if $0.first == nil { $0.first = now }; if chunk == chunks { $0.last = now } }
                }
            }
            defer { watcher.cancel() }
            let start = ContinuousClock.now
            await b.node.addPeer(.loopback(a.port))
            // Done when everything of a's is committed in b's store (b's own roster entries make
            // the digests differ until they reach a as well).
            let target = a.store.state.context
            let done = await waitUntil(.seconds(120)) { b.store.state.context.includes(target) }
            let elapsed = milliseconds(ContinuousClock.now - start)
            guard done else {
                let have = b.store.state.records.records(in: ShiftType.collection).count
                await a.stop(); await b.stop()
                throw BenchmarkFailure("sync-initial \(records): the fresh peer has \(have) of \(records) records after 120 s")
            }
            let traffic = await b.node.traffic()
            metrics["\(records)_ms"] = elapsed
            let (connected, first, last) = marks.withLock { $0 }
            if let connected { metrics["\(records)_connected_ms"] = milliseconds(connected - start) }
            if let first, let last {
                metrics["\(records)_first_chunk_ms"] = milliseconds(first - start)
                metrics["\(records)_last_chunk_ms"] = milliseconds(last - start)
            }
            metrics["\(records)_wire_bytes_per_record"] = Double(traffic.bytesReceived) / Double(records)
            // What b received, by message (frame bytes; the rest is TLS records).
            for (type, bytes) in await a.node.traffic().frameBytesSentByType where bytes > 0 {
                let name = Message.Kind(rawValue: type).map { "\($0)" } ?? "type\(type)"
                metrics["\(records)_frame_bytes_per_record_\(name)"] = Double(bytes) / Double(records)
            }
            await a.stop()
            await b.stop()
        }
        return Result(name: "sync-initial",
                      detail: "fresh peer receives a full state of 6-field records over TLS and commits it (connect → last chunk committed)",
                      metrics: metrics)
    }
}
