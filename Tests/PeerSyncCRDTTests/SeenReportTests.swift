@_spi(Engine) import PeerSyncCRDT
import PeerSyncTestSupport
import Testing

/// Signed compaction reports as bytes and as a map of the newest per replica (issue 32). The
/// signatures themselves are checked in PeerSyncIdentityTests; here they are placeholder bytes.
@Suite("Seen reports")
struct SeenReportTests {
    static func report(_ replica: Int, time: UInt64, _ context: CausalContext, signature: UInt8 = 7) -> SeenReport {
        SeenReport(groupID: Array(repeating: 1, count: 16), device: Array(repeating: 2, count: 20), replica: testReplica(replica),
                   time: time, context: context, signature: Array(repeating: signature, count: 64))
    }

    @Test("bytes round-trip; other formats, sizes, trailing and non-canonical bytes are refused")
    func bytes() throws {
        var rng = SeededGenerator(seed: baseSeed)
        for _ in 0..<200 {
            let original = Self.report(Int.random(in: 0..<3, using: &rng), time: UInt64.random(in: 0...1 << 47, using: &rng),
                                       CompactionTests.randomContext(&rng))
            #expect(try SeenReport(bytes: original.bytes) == original)
        }
        let bytes = Self.report(0, time: 300, CausalContext(versionVector: [testReplica(0): 4])).bytes
        #expect(throws: BinaryDecodingError.unsupportedVersion(2)) { try SeenReport(bytes: [2] + bytes.dropFirst()) }
        #expect(throws: BinaryDecodingError.self) { try SeenReport(bytes: bytes + [0]) }
        #expect(throws: BinaryDecodingError.self) { try SeenReport(bytes: Array(bytes.dropLast())) }
        // The time as an overlong varint (300 = ac 02 → ac 82 00): the same value, not canonical.
        let timeAt = 1 + 16 + 20 + 16
        #expect(Array(bytes[timeAt..<(timeAt + 2)]) == [0xac, 0x02])
        let overlong = Array(bytes[..<timeAt]) + [0xac, 0x82, 0x00] + Array(bytes[(timeAt + 2)...])
        #expect(throws: BinaryDecodingError.self) { try SeenReport(bytes: overlong) }
        // A time past the year 9999.
        let late = Self.report(0, time: ValidationLimits.maxPhysicalMilliseconds + 1, CausalContext())
        #expect(throws: BinaryDecodingError.self) { try SeenReport(bytes: late.bytes) }
    }

    @Test("the newest report of each replica wins; older, equal and conflicting ones change nothing")
    func newestWins() {
        let context = CausalContext(versionVector: [testReplica(0): 4])
        var reports = SeenReports()
        let first = reports.record(Self.report(0, time: 10, context))
        #expect(first)
        #expect(reports.offer(Self.report(0, time: 10, context)) == .same)
        #expect(reports.offer(Self.report(0, time: 9, CausalContext(versionVector: [testReplica(0): 9]))) == .older)
        #expect(reports.offer(Self.report(0, time: 10, context, signature: 8)) == .conflicting)
        let replay = reports.record(Self.report(0, time: 9, CausalContext(versionVector: [testReplica(0): 9])))
        #expect(!replay)
        #expect(reports[testReplica(0)]?.time == 10)
        let newer = reports.record(Self.report(0, time: 11, CausalContext(versionVector: [testReplica(0): 2])))
        #expect(newer)
        #expect(reports.contexts == [testReplica(0): CausalContext(versionVector: [testReplica(0): 2])])
        reports.retain { $0 != testReplica(0) }
        #expect(reports.isEmpty)
    }

    @Test("news: what a peer was not sent yet, without the replicas it hears itself")
    func news() {
        let reports = SeenReports((0..<4).map { Self.report($0, time: 100 + UInt64($0), CausalContext()) })
        let all = reports.news(since: [:]) { _ in false }
        #expect(all.map(\.replica) == (0..<4).map(testReplica))
        let sent = [testReplica(0): 100, testReplica(1): 50] as [ReplicaID: UInt64]
        let news = reports.news(since: sent) { $0 == testReplica(3) }
        #expect(news.map(\.replica) == [testReplica(1), testReplica(2)])
    }
}
