import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel

// W2 in memory, without the network (issue 30): a replica of 10,000 six-field records (one
// write each, as `fill` makes them), 10,000 one-field updates of random records (one
// `upsert` each, as W2's stream commits them), then the 10,000 deltas joined into B's
// starting state. Two ways of holding that state:
//   shared — `var sink = base`, as w2-stream measured: the first apply copies (copy-on-write)
//            the whole 10,000-record state inside the timed region;
//   fresh  — a state of its own, built before the clock starts (as pycrdt_bench.w2 builds
//            its doc from the start update before timing, and as W3 in memory does).
// Prints one line per mode: median, min, max of `rounds` after one warm-up, in ms.
//   cd Benchmarks/CRDTOnly && swift build -c release && .build/release/w2-apply [rounds] [--fresh-only]
// Instructions of one timed region, independent of the machine's load (counted inside
// ReplicaState.apply, which only the timed region calls; the executable keeps no local symbols):
//   valgrind --tool=callgrind --collect-atstart=no \
//     --toggle-collect='$s13PeerSyncModel12ReplicaStateV5apply*' .build/release/w2-apply --once fresh

struct RNG: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

func record(_ i: Int, _ rng: inout RNG) -> [String: FieldValue] {
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

func ms(_ d: Duration) -> Double { Double(d.components.seconds) * 1000 + Double(d.components.attoseconds) / 1e15 }

let arguments = CommandLine.arguments.dropFirst()
let rounds = arguments.first.flatMap { Int($0) } ?? 7
let freshOnly = arguments.contains("--fresh-only")
let records = 10_000
let updates = 10_000
let collection = "shiftTypes"

var a = ReplicaState(replicaID: ReplicaID(high: 1, low: 1), name: "a")
var rng = RNG(state: 21)
var keys: [UUID] = []
for i in 0..<records {
    let id = UUID()
    keys.append(id)
    a.write(record(i, &rng), to: RecordKey(collection: collection, id: id))
}
let base = a
var deltas: [RecordMap] = []
deltas.reserveCapacity(updates)
var pick = RNG(state: 22)
for i in 0..<updates {
    let key = RecordKey(collection: collection, id: keys.randomElement(using: &pick)!)
    if let delta = a.upsert(["duration": .int(Int64(1_000_000 + i))], to: key) { deltas.append(delta) }
}
precondition(deltas.count == updates)

/// B's starting state as a state of its own (nothing shared with `base`).
func fresh() -> ReplicaState {
    ReplicaState(replicaID: base.replicaID, name: base.name,
                 records: RecordMap(records: base.records.allRecords, context: base.context),
                 localSettings: base.localSettings, conflicts: base.conflicts)
}

/// The timed region.
@inline(never)
func applyAll(_ sink: inout ReplicaState, _ deltas: [RecordMap]) {
    for delta in deltas { sink.apply(delta) }
}

@MainActor
func run(_ label: String, _ prepare: () -> ReplicaState) {
    var samples: [Double] = []
    var digestOK = true
    for round in 0...rounds {
        var sink = prepare()
        let start = ContinuousClock.now
        applyAll(&sink, deltas)
        let elapsed = ms(ContinuousClock.now - start)
        digestOK = digestOK && sink.digest == a.digest
        if round > 0 { samples.append(elapsed) }
    }
    precondition(digestOK, "sink did not converge")
    samples.sort()
    print(String(format: "%@ median %.2f ms  min %.2f  max %.2f  (%d rounds)", label, samples[samples.count / 2],
                 samples.first!, samples.last!, samples.count))
}

if let once = arguments.firstIndex(of: "--once") {
    // One timed region only (for callgrind): `--once shared` or `--once fresh`.
    var sink = arguments[arguments.index(after: once)] == "shared" ? base : fresh()
    applyAll(&sink, deltas)
    precondition(sink.digest == a.digest)
} else {
    if !freshOnly { run("shared", { base }) }
    run("fresh ", fresh)
}
