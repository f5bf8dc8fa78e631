import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncTestSupport
import Testing

/// `events(of:after:through:)` (what a device seals for a relay, PROTOCOL §20.5): per-replica
/// runs of events, joined in any order and any cut, give back the state; each run's context
/// claims exactly its counters.
@Suite("Writer events", .computeLane)
struct WriterEventsTests {
    @Test("per-replica runs, cut anywhere and joined in any order, rebuild the state")
    func runsRebuildTheState() {
        let scenarios = [Scenarios.recordMap(), Scenarios.recordMap(replicas: 5, operations: 200)]
        var checked = 0
        for (s, scenario) in scenarios.enumerated() {
            for index in 0..<UInt64(s == 0 ? 300 : 80) {
                let seed = baseSeed &+ 9_100_000 &+ UInt64(s) * 100_000 &+ index
                var rng = SeededGenerator(seed: seed)
                for state in scenario.randomReplicas(&rng) {
                    var runs: [RecordMap] = []
                    for replica in state.context.versionVector.keys {
                        var after: UInt64 = 0
                        let held = state.context.contiguousCounter(of: replica)
                        while after < held {
                            let through = rng.chance(0.5) ? held : UInt64.random(in: (after + 1)...held, using: &rng)
                            guard let (run, last) = state.events(of: replica, after: after, through: through) else {
                                Issue.record("seed \(seed): no run after \(after)")
                                break
                            }
                            #expect(last == through, "seed \(seed)")
                            #expect(run.context == CausalContext(dots: ((after + 1)...last).map { Dot(replica: replica, counter: $0) }),
                                    "seed \(seed): the run claims other dots")
                            runs.append(run)
                            after = last
                        }
                        #expect(state.events(of: replica, after: held) == nil)
                    }
                    // Cloud dots (events seen out of order) are in no run: what a peer holding the
                    // contiguous part lacks brings them.
                    var rebuilt = RecordMap()
                    var parts = runs
                    if !state.context.dotCloud.isEmpty {
                        parts.append(state.delta(missingFrom: CausalContext(versionVector: state.context.versionVector)))
                    }
                    for run in parts.shuffled(using: &rng) { rebuilt.apply(run) }
                    #expect(rebuilt == state, "seed \(seed)")
                    #expect(rebuilt.digest == state.digest, "seed \(seed)")
                    checked += 1
                }
            }
        }
        #expect(checked > 800)
    }

    @Test("a run joins into a replica that lacks the writer's earlier events without claiming them")
    func aLateRunClaimsNothingEarlier() throws {
        var writer = RecordMap()
        var clock = HybridLogicalClock(latest: .zero, physicalClock: { 1_000 })
        let key = RecordKey(collection: "places", id: UUID())
        for step in 0..<5 { _ = try writer.write(["n": .int(Int64(step))], to: key, at: clock.tick(), by: testReplica(0)) }
        let (late, last) = try #require(writer.events(of: testReplica(0), after: 3))
        #expect(last == 5)
        var reader = RecordMap()
        reader.apply(late)
        #expect(reader.context.contiguousCounter(of: testReplica(0)) == 0)
        #expect(reader.context.contains(Dot(replica: testReplica(0), counter: 5)))
        #expect(reader.record(key)?.values["n"] == .int(4))
        reader.apply(try #require(writer.events(of: testReplica(0), after: 0, through: 3)).delta)
        #expect(reader == writer)
    }
}
