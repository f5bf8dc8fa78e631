// Issue 13 workload on PeerSync's CRDT layer: three replicas create N records (three fields
// each), exchange every delta, delete every record, exchange again, learn what everyone has
// seen, and compact. Prints the full-state bytes (RecordMap.encoded(), the form a full-state
// transfer and the store's blobs use) and the records held, beside an empty replica's.
// Built and run by Benchmarks/compare/run.sh (a throwaway package holding only PeerSyncCRDT).
import Foundation
@_spi(Engine) import PeerSyncCRDT
let n = CommandLine.arguments.count > 1 ? Int(CommandLine.arguments[1])! : 100_000
let start = ContinuousClock.now
let writers = (1...3).map { ReplicaID(high: 0xC0, low: UInt64($0)) }
var replicas = [RecordMap(), RecordMap(), RecordMap()]
let empty = RecordMap()
var time: UInt64 = 1_700_000_000_000
func key(_ i: Int) -> RecordKey {
    RecordKey(collection: "shifts", id: UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        UInt8(i >> 24 & 0xff), UInt8(i >> 16 & 0xff), UInt8(i >> 8 & 0xff), UInt8(i & 0xff))))
}
for i in 0..<n {
    let device = i % 3
    time += 1
    let delta = try replicas[device].write(
        ["name": .string("shift \(i)"), "start": .int(Int64(1_700_000_000 + i)), "minutes": .int(480)],
        to: key(i), at: HLCTimestamp(physicalMilliseconds: time, logical: 0), by: writers[device])
    for other in 0..<3 where other != device { replicas[other].apply(delta) }
}
let created = replicas[0].encoded().count
for i in 0..<n {
    let device = i % 3
    if let delta = try replicas[device].remove(key(i), by: writers[device]) {
        for other in 0..<3 where other != device { replicas[other].apply(delta) }
    }
}
precondition(replicas.allSatisfy { $0.invisibleRecordCount == n && $0.context == replicas[0].context })
let deletedBeforeCompaction = replicas[0].encoded().count
// Every replica has seen everything (acks would say so): two rounds of the frontier.
var frontier = CompactionFrontier()
let views = Dictionary(uniqueKeysWithValues: (0..<3).map { (writers[$0], MemberView(seen: replicas[$0].context, ownReplicas: [writers[$0]])) })
frontier.advance(members: views)
frontier.advance(members: views)
var purged = 0
for r in 0..<3 { purged += replicas[r].purge(stable: frontier.stable).keys.count }
precondition(purged == 3 * n && replicas.allSatisfy { $0.recordCount == 0 })
precondition(Set(replicas.map(\.digest)).count == 1)
let compacted = replicas[0].encoded().count
let seconds = Double((ContinuousClock.now - start).components.seconds)
print("""
{"system": "PeerSync (RecordMap, compacted)", "records": \(n), "empty": \(empty.encoded().count), "created": \(created), \
"deleted_before_compaction": \(deletedBeforeCompaction), "deleted": \(compacted), \
"records_held_after": \(replicas[0].recordCount), "seconds": \(seconds)}
""")
