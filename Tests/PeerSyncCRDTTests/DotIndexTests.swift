import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncTestSupport
import Testing

/// The dot index behind `delta(missingFrom:)` must give exactly what the full walk gives.
@Suite("Dot index", .computeLane)
struct DotIndexTests {
    /// Random reachable states (writes, deletes, lost and duplicated deliveries) of 3 and 5
    /// replicas; every ordered pair, plus random sub-contexts of the peer's.
    @Test("indexed extraction equals the full walk on thousands of random histories")
    func indexedEqualsFullWalk() {
        let scenarios = [Scenarios.recordMap(), Scenarios.recordMap(replicas: 5, operations: 200)]
        var compared = 0
        for (s, scenario) in scenarios.enumerated() {
            for index in 0..<UInt64(s == 0 ? 2_000 : 400) {
                let seed = baseSeed &+ 7_000_000 &+ UInt64(s) * 100_000 &+ index
                var rng = SeededGenerator(seed: seed)
                let replicas = scenario.randomReplicas(&rng)
                for a in replicas.indices {
                    #expect(replicas[a].isIndexed, "seed \(seed)")
                    var peers = replicas.indices.filter { $0 != a }.map { replicas[$0].context }
                    peers.append(CausalContext())
                    peers.append(randomSubContext(of: replicas[a].context, &rng))
                    peers.append(randomSubContext(of: replicas[(a + 1) % replicas.count].context, &rng))
                    for peer in peers {
                        let indexed = replicas[a].delta(missingFrom: peer)
                        let walked = replicas[a].deltaByFullWalk(missingFrom: peer)
                        #expect(indexed == walked, "seed \(seed), replica \(a)")
                        compared += 1
                    }
                }
            }
        }
        #expect(compared > 20_000)
    }

    /// Counters far past one bucket, overwrites past the rebuild threshold, out-of-order joins.
    @Test("after thousands of overwrites and a rebuild, extraction still equals the full walk")
    func rebuildKeepsExtractionExact() throws {
        var rng = SeededGenerator(seed: baseSeed &+ 8_000_000)
        var writer = RecordMap()
        var reader = RecordMap()
        let keys = (0..<50).map { RecordKey(collection: $0 % 2 == 0 ? "a" : "b", id: UUID()) }
        var clock = HybridLogicalClock(latest: .zero, physicalClock: { 1_000 })
        var deltas: [RecordMap] = []
        for step in 0..<6_000 {
            let key = keys.randomElement(using: &rng)!
            if step % 17 == 0 {
                if let delta = try writer.remove(key, by: testReplica(0)) { deltas.append(delta) }
            } else {
                deltas.append(try writer.write(["x": .int(Int64(step))], to: key, at: clock.tick(), by: testReplica(0)))
            }
        }
        #expect(writer.dotIndexEntryCount < 6_000, "the index was rebuilt (stale entries dropped)")
        // The reader gets a random subset of the deltas, shuffled (its context has a cloud).
        for delta in deltas.shuffled(using: &rng) where rng.chance(0.7) { reader.apply(delta) }
        #expect(writer.delta(missingFrom: reader.context) == writer.deltaByFullWalk(missingFrom: reader.context))
        #expect(reader.delta(missingFrom: writer.context) == reader.deltaByFullWalk(missingFrom: writer.context))
        var joined = reader
        joined.apply(writer.delta(missingFrom: reader.context))
        var reference = reader
        reference.apply(writer)
        #expect(joined == reference)
        #expect(joined.digest == writer.digest)
    }

    @Test("a state loaded from parts is indexed; deltas built to ship are not")
    func loadedStatesAreIndexed() throws {
        var state = RecordMap()
        var clock = HybridLogicalClock(latest: .zero, physicalClock: { 1_000 })
        let delta = try state.write(["x": .int(1)], to: RecordKey(collection: "a", id: UUID()), at: clock.tick(), by: testReplica(0))
        #expect(state.isIndexed)
        #expect(!delta.isIndexed)
        let loaded = RecordMap(records: state.allRecords, context: state.context)
        #expect(loaded.isIndexed)
        #expect(loaded.delta(missingFrom: CausalContext(dots: [Dot(replica: testReplica(9), counter: 1)])) == state.deltaByFullWalk(
            missingFrom: CausalContext(dots: [Dot(replica: testReplica(9), counter: 1)])))
    }

    /// A context holding a random subset of `context`'s dots.
    private func randomSubContext(of context: CausalContext, _ rng: inout SeededGenerator) -> CausalContext {
        var dots: [Dot] = []
        for replica in context.replicas {
            context.forEachEntry(of: replica) { counter, inCloud in
                if inCloud {
                    if rng.chance(0.5) { dots.append(Dot(replica: replica, counter: counter)) }
                } else if counter > 0 {
                    for c in 1...min(counter, 400) where rng.chance(0.6) { dots.append(Dot(replica: replica, counter: c)) }
                }
            }
        }
        return CausalContext(dots: dots)
    }
}

@Suite("Context changes")
struct ContextChangeTests {
    @Test("entriesChanged(since:) holds exactly the replicas whose entry changed; joined into the earlier context it gives the later")
    func changedEntries() {
        var rng = SeededGenerator(seed: baseSeed &+ 9_000_000)
        for _ in 0..<2_000 {
            var earlier = CausalContext()
            for _ in 0..<Int.random(in: 0..<30, using: &rng) {
                earlier.insert(Dot(replica: testReplica(Int.random(in: 0..<6, using: &rng)), counter: UInt64.random(in: 1...20, using: &rng)))
            }
            var later = earlier
            for _ in 0..<Int.random(in: 0..<10, using: &rng) {
                later.insert(Dot(replica: testReplica(Int.random(in: 0..<8, using: &rng)), counter: UInt64.random(in: 1...25, using: &rng)))
            }
            let changed = later.entriesChanged(since: earlier)
            #expect(earlier.merged(with: changed) == later)
            for replica in later.replicas {
                let same = later.contiguousCounter(of: replica) == earlier.contiguousCounter(of: replica)
                    && later.dotCloud[replica] == earlier.dotCloud[replica]
                #expect(changed.replicas.contains(replica) == !same)
            }
        }
    }
}
