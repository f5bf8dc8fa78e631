import Foundation
import Logging
import PeerSync

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
            if let delta = try a.store.write({ $0.upsert(["duration": .int(Int64(20_000 + i))], to: key) }) {
                await a.node.broadcast(delta)
            }
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
        for records in quick ? [500] : [10_000, 100_000] {
            let secret = BenchGroup()
            var a = try BenchNode("a", secret: secret)
            var b = try BenchNode("b", secret: secret)
            try fill(a.store, records: records, seed: 2)
            try await a.start()
            try await b.start()
            let events = b.node.events()
            let start = ContinuousClock.now
            await b.node.addPeer(.loopback(a.port))
            for await event in events {
                if case .catchUpProgress(_, let chunk, let chunks, _) = event, chunk == chunks { break }
            }
            // The last chunk is in; its commit may still be under way (group commit). Everything
            // of a's must be in b's store (b's own roster entries make the digests differ until
            // they reach a as well).
            let target = a.store.state.context
            let deadline = ContinuousClock.now + .seconds(60)
            while !b.store.state.context.includes(target), ContinuousClock.now < deadline { try? await Task.sleep(for: .milliseconds(1)) }
            let elapsed = milliseconds(ContinuousClock.now - start)
            precondition(b.store.state.context.includes(target), "fresh peer did not get everything")
            let traffic = await b.node.traffic()
            metrics["\(records)_ms"] = elapsed
            metrics["\(records)_wire_bytes_per_record"] = Double(traffic.bytesReceived) / Double(records)
            await a.stop()
            await b.stop()
        }
        return Result(name: "sync-initial",
                      detail: "fresh peer receives a full state of 6-field records over TLS and commits it (connect → last chunk committed)",
                      metrics: metrics)
    }
}
