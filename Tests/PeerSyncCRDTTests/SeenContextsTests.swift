import PeerSyncCRDT
import PeerSyncTestSupport
import Testing

/// The gossip map of what every replica has seen (compaction, issue 13).
@Suite("Seen contexts")
struct SeenContextsTests {
    static func random(_ rng: inout SeededGenerator) -> SeenContexts {
        var seen = SeenContexts()
        for _ in 0..<Int.random(in: 0..<4, using: &rng) {
            seen.record(testReplica(Int.random(in: 0..<3, using: &rng)), seen: CompactionTests.randomContext(&rng))
        }
        if rng.chance(0.5) { seen.recordStable(CompactionTests.randomContext(&rng)) }
        return seen
    }

    @Test("join laws") func joinLaws() throws {
        try LawChecker.checkJoinLaws(cases: 2_000) { rng in (Self.random(&rng), Self.random(&rng), Self.random(&rng)) }
    }

    @Test("a report only grows; removed replicas can be dropped") func reportsGrow() {
        var seen = SeenContexts()
        let a = testReplica(0)
        seen.record(a, seen: CausalContext(versionVector: [a: 5]))
        seen.record(a, seen: CausalContext(versionVector: [a: 3, testReplica(1): 2]))  // a late, older report
        #expect(seen.reports[a] == CausalContext(versionVector: [a: 5, testReplica(1): 2]))
        seen.record(testReplica(1), seen: CausalContext())
        #expect(seen.reports[testReplica(1)] == nil)
        seen.retain { $0 != a }
        #expect(seen.reports.isEmpty)
    }

    @Test("news since what a peer was told: joined into it, gives the whole (less the skipped reports); nothing new gives nil")
    func news() {
        for index in 0..<UInt64(2_000) {
            var rng = SeededGenerator(seed: baseSeed &+ index)
            let told = Self.random(&rng)
            // What we hold now is at least what we told (reports and stable only grow).
            let now = told.merged(with: Self.random(&rng))
            let skipped = testReplica(Int.random(in: 0..<4, using: &rng))
            let news = now.news(since: told) { $0 == skipped }
            var expected = now
            expected.retain { $0 != skipped }
            var joined = told
            joined.retain { $0 != skipped }
            if let news {
                #expect(news.reports[skipped] == nil, "seed \(baseSeed &+ index)")
                joined.merge(news)
            }
            #expect(joined == expected, "seed \(baseSeed &+ index)")
            #expect(now.news(since: now) { _ in false } == nil)
        }
    }

    @Test("the blob round-trips; damaged blobs are refused, never trapped on") func blob() throws {
        for index in 0..<UInt64(300) {
            var rng = SeededGenerator(seed: baseSeed &+ index)
            let seen = Self.random(&rng)
            let blob = seen.encodedBlob()
            #expect(try SeenContexts(blob: blob) == seen, "seed \(baseSeed &+ index)")
            for cut in 0..<blob.count {
                #expect(throws: BinaryDecodingError.self) { try SeenContexts(blob: Array(blob[..<cut])) }
            }
            #expect(throws: BinaryDecodingError.self) { try SeenContexts(blob: blob + [0]) }
        }
        #expect(throws: BinaryDecodingError.unsupportedVersion(2)) { try SeenContexts(blob: [2, 0, 0]) }
        // Two reports out of order.
        var out: [UInt8] = [1, 2]
        for r in [testReplica(1), testReplica(0)] { out += r.bigEndianBytes; let b = CausalContext(versionVector: [r: 1]).encodedBlob(); out += [UInt8(b.count)] + b }
        let empty = CausalContext().encodedBlob()
        out += [UInt8(empty.count)] + empty
        #expect(throws: BinaryDecodingError.self) { try SeenContexts(blob: out) }
    }
}
