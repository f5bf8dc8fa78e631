import Crypto
import Foundation
import Logging
import PeerSync
import Synchronization
import ShiftSchedulerModel

/// The app-facing API: live-query latency and cost per change, attachment store throughput.
enum AppBenchmarks {
    /// A replica in a temporary directory holding `count` shift types (one batch).
    static func replica(records count: Int) async throws -> (Replica, String) {
        let directory = temporaryStoreDirectory()
        var logger = Logger(label: "bench.app")
        logger.logLevel = .error
        let replica = try Replica.open(at: directory, name: "bench", logger: logger)
        try await replica.batch { b in
            for i in 0..<count {
                try b.save(ShiftType(symbol: "S", title: String(format: "shift %06d", i), duration: Double(3_600 + i % 8 * 600)))
            }
        }
        return (replica, directory)
    }

    /// With N records in the observed collection: (1) update latency, a one-field edit's
    /// `save` called → the live query's consumer holding the new result; (2) cost per change,
    /// the time the live query takes to produce the next result for an edit already committed,
    /// against (3) what an app without live queries does per change: fetchAll + filter + sort.
    /// N = 1,000 and 10,000 show how each scales with the collection.
    static let liveQuery = Benchmark(name: "live-query") { quick in
        var metrics: [String: Double] = [:]
        for records in quick ? [500] : [1_000, 10_000] {
            let suffix = records >= 1_000 ? "_\(records / 1_000)k" : "_\(records)"
            for (key, value) in try await liveQuery(records: records, changes: quick ? 20 : 500, naiveRounds: quick ? 5 : 10) {
                metrics[key + suffix] = value
            }
        }
        return Result(
            name: "live-query",
            detail: "N shift types, query keeps 7/8 sorted by duration+title; one-field edits; live = next result after a "
                + "committed edit, naive = fetchAll+filter+sort, latency = save called → result received",
            metrics: metrics)
    }

    static func liveQuery(records: Int, changes: Int, naiveRounds: Int) async throws -> [String: Double] {
        let (replica, directory) = try await replica(records: records)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        // Keeps all but one in 8; ordered by duration, then title: an edit of a title moves a record.
        let query = RecordQuery(ShiftType.self, where: { $0.duration != 3_600 },
                                sortedBy: [KeyPathComparator(\ShiftType.duration), KeyPathComparator(\ShiftType.title)])
        var all = try replica.fetchAll(ShiftType.self).filter { $0.duration != 3_600 }
        var rng = BenchRNG(state: 7)

        // Cost per change: the consumer asks for the next result after the edit committed.
        var iterator = replica.observe(query).makeAsyncIterator()
        let loadStart = ContinuousClock.now
        guard try await iterator.next()?.count == all.count else { throw BenchmarkFailure("initial result") }
        let loadMs = milliseconds(ContinuousClock.now - loadStart)
        var liveSamples: [Double] = []
        for i in 0..<changes {
            let index = Int.random(in: 0..<all.count, using: &rng)
            all[index].title = "edited \(i) " + all[index].title
            try await replica.save(all[index])
            let start = ContinuousClock.now
            guard let result = try await iterator.next(), result.count == all.count else { throw BenchmarkFailure("live result") }
            liveSamples.append(milliseconds(ContinuousClock.now - start))
        }
        // The naive way, per change: evaluate the query over the whole collection.
        var naiveSamples: [Double] = []
        for _ in 0..<naiveRounds {
            let start = ContinuousClock.now
            let result = try replica.fetchAll(query)
            naiveSamples.append(milliseconds(ContinuousClock.now - start))
            guard result.count == all.count else { throw BenchmarkFailure("naive result") }
        }

        // Latency: a consumer task waits on the live query; the producer edits and waits for it.
        let (arrivals, continuation) = AsyncStream<ContinuousClock.Instant>.makeStream()
        let consumer = Task {
            do {
                for try await _ in replica.observe(query) { continuation.yield(.now) }
            } catch {}
            continuation.finish()
        }
        var arrival = arrivals.makeAsyncIterator()
        _ = await arrival.next()  // the initial result
        var latencySamples: [Double] = []
        for i in 0..<changes {
            let index = Int.random(in: 0..<all.count, using: &rng)
            all[index].title = "again \(i) " + all[index].title
            let start = ContinuousClock.now
            try await replica.save(all[index])
            guard let emitted = await arrival.next() else { throw BenchmarkFailure("latency consumer ended") }
            latencySamples.append(milliseconds(emitted - start))
        }
        consumer.cancel()
        liveSamples.sort()
        naiveSamples.sort()
        latencySamples.sort()
        // Not named *_p50_ms: those keys make rows of the convergence table.
        return [
            "initial_load_ms": loadMs,
            "live_per_change_ms_p50": percentile(liveSamples, 0.5), "live_per_change_ms_p99": percentile(liveSamples, 0.99),
            "naive_per_change_ms_p50": percentile(naiveSamples, 0.5),
            "latency_ms_p50": percentile(latencySamples, 0.5), "latency_ms_p99": percentile(latencySamples, 0.99),
        ]
    }

    /// Adding a 10 MB attachment (hash + temporary file + fsync + rename + directory fsync)
    /// from memory and from a file, against writing and fsyncing the same bytes raw.
    static let attachmentAdd = Benchmark(name: "attachment-add") { quick in
        let size = quick ? 1 << 20 : 10_000_000
        let rounds = quick ? 2 : 5
        let (replica, directory) = try await replica(records: 0)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var rng = BenchRNG(state: 11)
        var bytes = Data((0..<size).map { _ in UInt8.random(in: 0...255, using: &rng) })
        let source = directory + "/source.bin"
        let raw = directory + "/raw.bin"
        var fromData: [Double] = []
        var fromFile: [Double] = []
        var rawWrite: [Double] = []
        var hashOnly: [Double] = []
        for round in 0..<rounds {
            bytes[0] = UInt8(round)  // new content each round: no deduplication
            var start = ContinuousClock.now
            _ = try await replica.addAttachment(bytes)
            fromData.append(milliseconds(ContinuousClock.now - start))

            bytes[1] = UInt8(round)
            try bytes.write(to: URL(fileURLWithPath: source))
            start = ContinuousClock.now
            _ = try await replica.addAttachment(contentsOf: URL(fileURLWithPath: source))
            fromFile.append(milliseconds(ContinuousClock.now - start))

            start = ContinuousClock.now
            _ = FileManager.default.createFile(atPath: raw, contents: nil)
            let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: raw))
            try handle.write(contentsOf: bytes)
            try handle.synchronize()
            try handle.close()
            rawWrite.append(milliseconds(ContinuousClock.now - start))
            try FileManager.default.removeItem(atPath: raw)

            start = ContinuousClock.now
            _ = SHA256.hash(data: bytes)
            hashOnly.append(milliseconds(ContinuousClock.now - start))
        }
        func median(_ samples: [Double]) -> Double { samples.sorted()[samples.count / 2] }
        func megabytesPerSecond(_ ms: Double) -> Double { Double(size) / 1e6 / (ms / 1_000) }
        return Result(
            name: "attachment-add",
            detail: "\(size) random bytes, median of \(rounds): addAttachment(Data), addAttachment(contentsOf:), "
                + "raw write+fsync, SHA-256 alone",
            metrics: [
                "add_data_ms": median(fromData), "add_data_MBps": megabytesPerSecond(median(fromData)),
                "add_file_ms": median(fromFile), "add_file_MBps": megabytesPerSecond(median(fromFile)),
                "raw_write_fsync_ms": median(rawWrite), "raw_write_fsync_MBps": megabytesPerSecond(median(rawWrite)),
                "sha256_ms": median(hashOnly),
            ])
    }
}
