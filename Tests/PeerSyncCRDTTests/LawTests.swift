@_spi(Engine) import PeerSyncCRDT
import PeerSyncTestSupport
import Testing

/// One law checker, run on every CRDT type: join laws on random reachable states, and
/// convergence under random delivery order with duplicates and losses, then anti-entropy.
@Suite("CRDT laws", .computeLane)
struct LawTests {
    static let joinCases = 2_000
    static let convergenceRuns = 500

    @Test("record map: join laws") func recordMapJoin() throws {
        try LawChecker.checkJoinLaws(Scenarios.recordMap(), cases: Self.joinCases)
    }

    @Test("record map: convergence with equal digests") func recordMapConvergence() throws {
        try LawChecker.checkConvergence(Scenarios.recordMap(), runs: Self.convergenceRuns)
        try LawChecker.checkConvergence(Scenarios.recordMap(replicas: 5, operations: 80), runs: 100, seed: baseSeed &+ 1_000_000)
    }

    @Test("record map: extraction gives exactly what the peer lacks") func recordMapExtraction() throws {
        try LawChecker.checkExtraction(Scenarios.recordMap(), cases: 1_000)
    }

    @Test("OR-set: join laws") func orSetJoin() throws {
        try LawChecker.checkJoinLaws(Scenarios.orSet(), cases: Self.joinCases)
    }

    @Test("OR-set: convergence") func orSetConvergence() throws {
        try LawChecker.checkConvergence(Scenarios.orSet(), runs: Self.convergenceRuns)
    }

    @Test("LWW register: join laws") func registerJoin() throws {
        try LawChecker.checkJoinLaws(Scenarios.lwwRegister(), cases: Self.joinCases)
    }

    @Test("LWW register: convergence") func registerConvergence() throws {
        try LawChecker.checkConvergence(Scenarios.lwwRegister(), runs: Self.convergenceRuns)
    }

    @Test("causal context: join laws") func contextJoin() throws {
        try LawChecker.checkJoinLaws(Scenarios.causalContext(), cases: Self.joinCases)
    }

    @Test("causal context: convergence") func contextConvergence() throws {
        try LawChecker.checkConvergence(Scenarios.causalContext(), runs: Self.convergenceRuns)
    }

    @Test("HLC timestamps: join laws") func hlcJoin() throws {
        try LawChecker.checkJoinLaws(Scenarios.hlcTimestamp(), cases: Self.joinCases)
    }

    @Test("HLC timestamps: convergence") func hlcConvergence() throws {
        try LawChecker.checkConvergence(Scenarios.hlcTimestamp(), runs: Self.convergenceRuns)
    }

    @Test("the law checker catches a broken join")
    func checkerCatchesBrokenJoin() {
        // A "join" that keeps the left side is not commutative; the checker must say so.
        struct LeftWins: JoinSemilattice, Sendable {
            var value: Int
            mutating func merge(_ other: LeftWins) {}
        }
        #expect(throws: LawViolation.self) {
            try LawChecker.checkJoinLaws(cases: 10) { rng in
                (LeftWins(value: Int.random(in: 0..<9, using: &rng)), LeftWins(value: Int.random(in: 10..<19, using: &rng)), LeftWins(value: 0))
            }
        }
    }

    @Test("the incremental digest equals a digest computed from scratch")
    func digestMatchesRecomputation() {
        let scenario = Scenarios.recordMap()
        for index in 0..<UInt64(500) {
            var rng = SeededGenerator(seed: baseSeed &+ index)
            for state in scenario.randomReplicas(&rng) {
                let rebuilt = RecordMap(records: state.allRecords, context: state.context)
                #expect(rebuilt == state, "seed \(baseSeed &+ index)")
                #expect(rebuilt.digest == state.digest, "seed \(baseSeed &+ index)")
            }
        }
    }

    @Test("the incremental digest follows a context whose cloud grows and is then absorbed by the vector")
    func digestFollowsCloud() throws {
        // One replica's writes, joined out of order into a digest-maintaining map: the odd
        // counters first (each lands in the cloud), then the even ones (each absorbs the run
        // of cloud dots after it into the version vector), then a vector that jumps past all.
        var rng = SeededGenerator(seed: baseSeed)
        let writer = ReplicaID.random(using: &rng)
        var source = RecordMap()
        var deltas: [RecordMap] = []
        for i in 0..<40 {
            deltas.append(try source.write(["n": .int(Int64(i))], to: RecordKey(collection: "c", id: UUID()),
                                           at: HLCTimestamp(physicalMilliseconds: 1_000 + UInt64(i), logical: 0), by: writer))
        }
        var joined = RecordMap()
        let order = stride(from: 1, to: 40, by: 2).map { deltas[$0] } + stride(from: 0, to: 40, by: 2).map { deltas[$0] }
        for (step, delta) in order.enumerated() {
            joined.merge(delta)
            #expect(joined.digest == RecordMap(records: joined.allRecords, context: joined.context).digest, "after join \(step)")
        }
        #expect(joined == source && joined.context.dotCloud.isEmpty)
        var jumped = RecordMap()
        jumped.merge(order[0])
        jumped.merge(source)
        #expect(jumped.digest == source.digest)
    }

    @Test("states whose visible records or contexts differ have unequal digests")
    func digestsSeparateStates() {
        let scenario = Scenarios.recordMap()
        var seen: [StateDigest: RecordMap] = [:]
        for index in 0..<UInt64(300) {
            var rng = SeededGenerator(seed: baseSeed &+ index)
            for state in scenario.randomReplicas(&rng) {
                let visible = Self.visiblePart(of: state)
                if let earlier = seen[state.digest] {
                    #expect(earlier == visible, "digest collision between unequal states, seed \(baseSeed &+ index)")
                }
                seen[state.digest] = visible
            }
        }
        #expect(seen.count > 100)
    }

    @Test("deleted records are not in the digest: holding, purging or never having one changes nothing; a revival does")
    func digestLeavesDeletedRecordsOut() throws {
        let scenario = Scenarios.recordMap()
        var checkedDeleted = 0
        for index in 0..<UInt64(300) {
            var rng = SeededGenerator(seed: baseSeed &+ index)
            for state in scenario.randomReplicas(&rng) {
                let visible = Self.visiblePart(of: state)
                #expect(visible.digest == state.digest, "seed \(baseSeed &+ index)")
                checkedDeleted += state.invisibleRecordCount
            }
        }
        #expect(checkedDeleted > 50)
        // One record through its life, on a map that keeps its digest incrementally.
        let a = ReplicaID(high: 1, low: 1)
        let key = RecordKey(collection: "c", id: UUID())
        var map = RecordMap()
        let empty = map.digest
        try map.write(["x": .int(1)], to: key, at: HLCTimestamp(physicalMilliseconds: 10, logical: 0), by: a)
        let written = map.digest
        #expect(written != empty)
        try map.remove(key, by: a)
        #expect(map.digest == Self.visiblePart(of: map).digest && map.digest != written)
        try map.write(["y": .int(2)], to: key, at: HLCTimestamp(physicalMilliseconds: 20, logical: 0), by: a)
        #expect(map.record(key)?.isVisible == true && map.digest == RecordMap(records: map.allRecords, context: map.context).digest)
    }

    /// The state with its deleted records left out (same context).
    static func visiblePart(of state: RecordMap) -> RecordMap {
        RecordMap(records: state.allRecords.filter { $0.1.isVisible }, context: state.context)
    }
}
