@_spi(Engine) import PeerSyncCRDT

/// Replica IDs 0, 1, 2, … for tests (deterministic, ordered by index).
public func testReplica(_ index: Int) -> ReplicaID {
    ReplicaID(high: 0x7E57, low: UInt64(index + 1))
}

/// Shared randomized scenarios, one per CRDT type.
public enum Scenarios {
    /// Records in two collections, three fields, writes of 1–3 fields and deletes; every
    /// replica's physical clock is frozen at the same instant, so timestamps tie across
    /// replicas and only the logical counter and replica order decide.
    package static func recordMap(replicas: Int = 3, operations: Int = 30) -> ReplicationScenario<RecordMap> {
        ReplicationScenario(
            replicaCount: replicas, operationsPerRun: operations,
            makeReplica: { _ in RecordMap() },
            mutate: { state, index, rng in
                let key = RecordKey(
                    collection: ["a", "b"].randomElement(using: &rng)!,
                    id: UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, UInt8.random(in: 0..<4, using: &rng))))
                if rng.chance(0.25) {
                    return try? state.remove(key, by: testReplica(index))  // nil: a no-op (counters never run out here)
                }
                var clock = HybridLogicalClock(latest: state.maxTimestamp, physicalClock: { 1_000 })
                var fields: [String: FieldValue] = [:]
                for name in ["x", "y", "z"] where rng.chance(0.5) {
                    fields[name] = .int(Int64.random(in: 0..<5, using: &rng))
                }
                return try? state.write(fields, to: key, at: clock.tick(), by: testReplica(index))
            },
            antiEntropy: { from, to in from.delta(missingFrom: to.context) },
            digest: { $0.digest }
        )
    }

    package static func orSet(replicas: Int = 3, operations: Int = 30) -> ReplicationScenario<ORSet<Int>> {
        ReplicationScenario(
            replicaCount: replicas, operationsPerRun: operations,
            makeReplica: { _ in ORSet<Int>() },
            mutate: { state, index, rng in
                let element = Int.random(in: 0..<5, using: &rng)
                if rng.chance(0.4) { return state.remove(element) }
                return try? state.insert(element, by: testReplica(index))
            }
        )
    }

    package static func lwwRegister(replicas: Int = 3, operations: Int = 30) -> ReplicationScenario<LWWRegister<Int>> {
        ReplicationScenario(
            replicaCount: replicas, operationsPerRun: operations,
            makeReplica: { _ in LWWRegister(value: 0, stamp: WriteStamp(time: .zero, replica: testReplica(0))) },
            mutate: { state, index, rng in
                var clock = HybridLogicalClock(latest: state.stamp.time, physicalClock: { 1_000 })
                return state.assign(Int.random(in: 0..<100, using: &rng), clock: &clock, replica: testReplica(index))
            }
        )
    }

    package static func causalContext(replicas: Int = 3, operations: Int = 30) -> ReplicationScenario<CausalContext> {
        ReplicationScenario(
            replicaCount: replicas, operationsPerRun: operations,
            makeReplica: { _ in CausalContext() },
            mutate: { state, _, rng in
                let dot = Dot(replica: testReplica(Int.random(in: 0..<3, using: &rng)),
                              counter: UInt64.random(in: 1...12, using: &rng))
                let delta = CausalContext(dots: [dot])
                state.merge(delta)
                return delta
            }
        )
    }

    package static func hlcTimestamp(replicas: Int = 3, operations: Int = 30) -> ReplicationScenario<HLCTimestamp> {
        ReplicationScenario(
            replicaCount: replicas, operationsPerRun: operations,
            makeReplica: { _ in .zero },
            mutate: { state, _, rng in
                var clock = HybridLogicalClock(latest: state, physicalClock: { 0 })
                let delta = clock.tick()
                state.merge(delta)
                return delta
            }
        )
    }
}
