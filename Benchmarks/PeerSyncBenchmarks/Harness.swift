import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import ShiftSchedulerModel

struct Result: Codable {
    var name: String
    var detail: String
    var metrics: [String: Double]
}

struct Benchmark: Sendable {
    let name: String
    let run: @Sendable (_ quick: Bool) async throws -> Result
    static let all: [Benchmark] = [
        CRDTBenchmarks.crdtApply, CRDTBenchmarks.crdtExtract, CRDTBenchmarks.modelSave,
        StoreBenchmarks.fullStateCommit, StoreBenchmarks.editCommit, StoreBenchmarks.retention, StoreBenchmarks.crossProcess,
        SyncBenchmarks.latency, SyncBenchmarks.initialSync,
        ConvergenceBenchmarks.w1FullState, ConvergenceBenchmarks.w2Stream, ConvergenceBenchmarks.w3Partition,
        ConvergenceBenchmarks.w4Memory, ConvergenceBenchmarks.mesh, MultiprocessBenchmark.multiprocess,
        HandshakeBenchmark.handshake,
        AppBenchmarks.liveQuery, AppBenchmarks.attachmentAdd, AttachmentTransferBenchmark.transfer,
        HostileInputBenchmarks.hostileInput, CompactionBenchmark.deleteAll, RelayScaleBenchmark.scale,
    ]
}

func milliseconds(_ duration: Duration) -> Double {
    Double(duration.components.seconds) * 1_000 + Double(duration.components.attoseconds) / 1e15
}

/// Median of `rounds` timings of `body`, after one warm-up.
func medianMilliseconds(rounds: Int, _ body: () -> Void) -> Double {
    body()
    var samples: [Double] = []
    for _ in 0..<rounds {
        samples.append(milliseconds(ContinuousClock().measure(body)))
    }
    return samples.sorted()[samples.count / 2]
}

func shiftFields(_ i: Int, _ rng: inout some RandomNumberGenerator) -> [String: FieldValue] {
    [
        "symbol": .string(String("ENLDX".randomElement(using: &rng)!) + "\(i % 10)"),
        "title": .string("Shift \(i) title"),
        "duration": .int(Int64(28_800 + i % 7 * 600)),
        "description": .string("A shift type for benchmark record number \(i)."),
        "locationID": .string(UUID().uuidString),
    ]
}

struct BenchRNG: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// A source replica holding `records` shift-type records, and a copy of it on a second replica.
func seededPair(records: Int) -> (ReplicaState, ReplicaState, [RecordKey]) {
    var rng = BenchRNG(state: 42)
    var source = ReplicaState(replicaID: ReplicaID.random(using: &rng), name: "source")
    var keys: [RecordKey] = []
    for i in 0..<records {
        let key = RecordKey(collection: "shiftTypes", id: UUID())
        keys.append(key)
        source.write(shiftFields(i, &rng), to: key)
    }
    var sink = ReplicaState(replicaID: ReplicaID.random(using: &rng), name: "sink")
    sink.apply(source.delta(missingFrom: sink.context))
    return (source, sink, keys)
}

enum CRDTBenchmarks {
static let crdtApply = Benchmark(name: "crdt-apply") { quick in
    let records = quick ? 500 : 10_000
    let updates = quick ? 500 : 10_000
    var (source, sink, keys) = seededPair(records: records)
    var rng = BenchRNG(state: 7)
    var deltas: [RecordMap] = []
    deltas.reserveCapacity(updates)
    for i in 0..<updates {
        deltas.append(source.write(["title": .string("Updated title \(i)")], to: keys.randomElement(using: &rng)!))
    }
    let base = sink
    let ms = medianMilliseconds(rounds: quick ? 1 : 7) {
        sink = base
        for delta in deltas { sink.apply(delta) }
    }
    precondition(sink.digest == source.digest, "sink did not converge")
    return Result(name: "crdt-apply",
                  detail: "apply \(updates) single-field deltas to a \(records)-record collection (digest kept current)",
                  metrics: ["total_ms": ms, "per_delta_us": ms * 1_000 / Double(updates)])
}

static let crdtExtract = Benchmark(name: "crdt-extract") { quick in
    let records = quick ? 500 : 10_000
    let (source, _, _) = seededPair(records: records)
    var extracted = RecordMap()
    let full = medianMilliseconds(rounds: quick ? 1 : 7) { extracted = source.delta(missingFrom: CausalContext()) }
    precondition(extracted.recordCount == records)
    var joined = RecordMap()
    let join = medianMilliseconds(rounds: quick ? 1 : 7) {
        joined = RecordMap()
        joined.apply(extracted)
    }
    precondition(joined.digest == source.digest)
    return Result(name: "crdt-extract",
                  detail: "extract the full state of \(records) records for a new peer, and join it into an empty replica",
                  metrics: ["extract_ms": full, "join_ms": join])
}

static let modelSave = Benchmark(name: "model-save") { quick in
    let count = quick ? 500 : 10_000
    var rng = BenchRNG(state: 3)
    let shifts = (0..<count).map { i in
        ShiftType(symbol: "E\(i % 10)", title: "Shift \(i)", description: "Benchmark shift type \(i)",
                  duration: 28_800, locationID: UUID())
    }
    _ = rng.next()
    var replica = ReplicaState(name: "bench")
    let ms = medianMilliseconds(rounds: quick ? 1 : 5) {
        replica = ReplicaState(name: "bench")
        for shift in shifts { _ = try! replica.save(shift) }
    }
    return Result(name: "model-save",
                  detail: "save \(count) typed ShiftType records (Codable → fields → delta) into a replica",
                  metrics: ["total_ms": ms, "per_record_us": ms * 1_000 / Double(count)])
}
}
