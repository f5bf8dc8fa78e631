import Foundation
@_spi(Engine) import PeerSyncCRDT

// W3 in memory, RecordMap only: 3 replicas of 10,000 six-field records, partitioned; each makes
// 200 deletes, 2,000 one-field updates, 200 inserts; then each joins what the other two have
// that it lacks. Indexed extraction (delta(missingFrom:)) against the full walk (the old code).

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

func rss() -> Double {
    let s = (try? String(contentsOfFile: "/proc/self/status", encoding: .utf8)) ?? ""
    for line in s.split(separator: "\n") where line.hasPrefix("VmRSS:") {
        return Double(line.split(separator: " ")[1])! * 1024
    }
    return 0
}

let records = 10_000
let collection = "shiftTypes"
var clock = HybridLogicalClock(latest: .zero, physicalClock: { UInt64(Date().timeIntervalSince1970 * 1000) })
let writers = (0..<3).map { ReplicaID(high: 1, low: UInt64($0 + 1)) }
var rng = RNG(state: 31)
var base = RecordMap()
var keys: [UUID] = []
for i in 0..<records {
    let id = UUID()
    keys.append(id)
    try base.write(record(i, &rng), to: RecordKey(collection: collection, id: id), at: clock.tick(), by: writers[0])
}
var states = [base, base, base]
for index in 0..<3 {
    var rng = RNG(state: 300 + UInt64(index))
    var shuffled = keys.shuffled(using: &rng)
    for _ in 0..<200 { _ = try states[index].remove(RecordKey(collection: collection, id: shuffled.removeLast()), by: writers[index]) }
    for i in 0..<2_000 {
        let field = ["title", "symbol", "duration", "description"][i % 4]
        let value: FieldValue = field == "duration" ? .int(Int64(index * 100_000 + i)) : .string("\(field) \(index)-\(i)")
        try states[index].write([field: value], to: RecordKey(collection: collection, id: shuffled[i % shuffled.count]), at: clock.tick(), by: writers[index])
    }
    for i in 0..<200 { try states[index].write(record(records + i, &rng), to: RecordKey(collection: collection, id: UUID()), at: clock.tick(), by: writers[index]) }
}
precondition(states.allSatisfy(\.isIndexed))

func run(_ states: [RecordMap], indexed: Bool, rounds: Int = 5) -> (merge: Double, extract: Double) {
    var merges: [Double] = []
    var extracts: [Double] = []
    for round in 0...rounds {
        var merged = states.map { RecordMap(records: $0.allRecords, context: $0.context) }
        var extracting = Duration.zero
        let start = ContinuousClock.now
        for i in merged.indices {
            for j in states.indices where j != i {
                let t = ContinuousClock.now
                let delta = indexed ? states[j].delta(missingFrom: merged[i].context) : states[j].deltaByFullWalk(missingFrom: merged[i].context)
                extracting += ContinuousClock.now - t
                merged[i].apply(delta)
            }
        }
        let elapsed = ContinuousClock.now - start
        precondition(merged[0].digest == merged[1].digest && merged[1].digest == merged[2].digest)
        if round > 0 { merges.append(ms(elapsed)); extracts.append(ms(extracting)) }
    }
    return (merges.sorted()[merges.count / 2], extracts.sorted()[extracts.count / 2])
}

// `w3-memory --profile`: the indexed merge only, 40 rounds into copies built beforehand, so a
// profile (perf record) holds the merge and little else.
if CommandLine.arguments.contains("--profile") {
    var copies = (0..<40).map { _ in states.map { RecordMap(records: $0.allRecords, context: $0.context) } }
    var samples: [Double] = []
    var done: [[RecordMap]] = []  // freed at the end, outside the profile's merges
    for k in copies.indices {
        var merged: [RecordMap] = []
        swap(&merged, &copies[k])  // uniquely referenced: the merge changes it in place
        let start = ContinuousClock.now
        for i in merged.indices {
            for j in states.indices where j != i { merged[i].apply(states[j].delta(missingFrom: merged[i].context)) }
        }
        samples.append(ms(ContinuousClock.now - start))
        precondition(merged[0].digest == merged[1].digest && merged[1].digest == merged[2].digest)
        done.append(merged)
    }
    print(String(format: "w3 in memory, indexed: merge %.1f ms (median of 40)", samples.sorted()[20]))
    exit(0)
}
let walked = run(states, indexed: false)
let indexed = run(states, indexed: true)
print(String(format: "w3 in memory: full walk merge %.1f ms (extract %.1f ms) | indexed merge %.1f ms (extract %.1f ms)",
             walked.merge, walked.extract, indexed.merge, indexed.extract))

// Memory: 100,000 six-field records written one by one into a replica state (index included).
do {
    var rng = RNG(state: 7)
    let before = rss()
    var state = RecordMap()
    for i in 0..<100_000 {
        try state.write(record(i, &rng), to: RecordKey(collection: collection, id: UUID()), at: clock.tick(), by: writers[0])
    }
    let after = rss()
    print(String(format: "w4-like: %.0f B/record (RecordMap only, dot index entries %d)", (after - before) / 100_000, state.dotIndexEntryCount))
    withExtendedLifetime(state) {}
}
