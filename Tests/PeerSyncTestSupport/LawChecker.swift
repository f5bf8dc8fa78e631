@_spi(Engine) import PeerSyncCRDT

/// A law that failed, with the seed that reproduces it (`PEERSYNC_SEED=<seed>`, one case).
public struct LawViolation: Error, CustomStringConvertible {
    public let law: String
    public let seed: UInt64
    public let detail: String

    public var description: String { "\(law) violated — replay with seed \(seed): \(detail)" }
}

/// A randomized replication scenario for one CRDT type: how to make replicas, how to mutate
/// them (returning the delta), and how one replica brings another up to date (anti-entropy).
package struct ReplicationScenario<State: JoinSemilattice & Sendable>: Sendable {
    public var replicaCount: Int
    public var operationsPerRun: Int
    public var makeReplica: @Sendable (_ index: Int) -> State
    /// A random mutation of the replica at `index`; returns its delta, or nil for a no-op.
    public var mutate: @Sendable (_ state: inout State, _ index: Int, _ rng: inout SeededGenerator) -> State?
    /// What `from` sends `to` in anti-entropy. Defaults to the full state.
    public var antiEntropy: @Sendable (_ from: State, _ to: State) -> State
    /// The digest of a state, if the type keeps one; converged replicas must agree on it.
    package var digest: (@Sendable (State) -> StateDigest)?

    package init(
        replicaCount: Int = 3, operationsPerRun: Int = 30,
        makeReplica: @escaping @Sendable (Int) -> State,
        mutate: @escaping @Sendable (inout State, Int, inout SeededGenerator) -> State?,
        antiEntropy: @escaping @Sendable (State, State) -> State = { from, _ in from },
        digest: (@Sendable (State) -> StateDigest)? = nil
    ) {
        self.replicaCount = replicaCount
        self.operationsPerRun = operationsPerRun
        self.makeReplica = makeReplica
        self.mutate = mutate
        self.antiEntropy = antiEntropy
        self.digest = digest
    }

    /// Runs random operations on every replica while delivering their deltas in random order,
    /// with duplicates and losses; returns the replicas as they are then (diverged, but each a
    /// reachable state).
    public func randomReplicas(_ rng: inout SeededGenerator) -> [State] {
        var replicas = (0..<replicaCount).map(makeReplica)
        var inFlight: [(target: Int, delta: State)] = []
        var operations = 0
        while operations < operationsPerRun || !inFlight.isEmpty {
            if operations < operationsPerRun && (inFlight.isEmpty || rng.chance(0.5)) {
                operations += 1
                let index = Int.random(in: 0..<replicaCount, using: &rng)
                guard let delta = mutate(&replicas[index], index, &rng) else { continue }
                for target in 0..<replicaCount where target != index {
                    if rng.chance(0.2) { continue }  // lost
                    inFlight.append((target, delta))
                    if rng.chance(0.2) { inFlight.append((target, delta)) }  // duplicated
                }
            } else {
                let message = inFlight.remove(at: Int.random(in: 0..<inFlight.count, using: &rng))
                replicas[message.target].merge(message.delta)
            }
        }
        return replicas
    }

    /// Brings every replica up to date with anti-entropy between every ordered pair.
    public func reconcile(_ replicas: inout [State]) {
        for _ in 0..<2 {
            for from in replicas.indices {
                for to in replicas.indices where to != from {
                    replicas[to].merge(antiEntropy(replicas[from], replicas[to]))
                }
            }
        }
    }
}

/// The laws every CRDT in PeerSync must keep, checked on seeded random cases.
public enum LawChecker {
    /// Join is commutative, associative and idempotent on `cases` random triples of states.
    package static func checkJoinLaws<State: JoinSemilattice>(
        cases: Int, seed: UInt64 = baseSeed, generate: (inout SeededGenerator) -> (State, State, State)
    ) throws(LawViolation) {
        for index in 0..<UInt64(cases) {
            let caseSeed = seed &+ index
            var rng = SeededGenerator(seed: caseSeed)
            let (a, b, c) = generate(&rng)
            guard a.merged(with: b) == b.merged(with: a) else {
                throw LawViolation(law: "commutativity", seed: caseSeed, detail: "a ⊔ b != b ⊔ a")
            }
            guard a.merged(with: b).merged(with: c) == a.merged(with: b.merged(with: c)) else {
                throw LawViolation(law: "associativity", seed: caseSeed, detail: "(a ⊔ b) ⊔ c != a ⊔ (b ⊔ c)")
            }
            guard a.merged(with: a) == a, a.merged(with: b).merged(with: b) == a.merged(with: b) else {
                throw LawViolation(law: "idempotence", seed: caseSeed, detail: "a ⊔ a != a")
            }
        }
    }

    /// Join laws on random *reachable* states of a scenario (three diverged replicas).
    package static func checkJoinLaws<State>(
        _ scenario: ReplicationScenario<State>, cases: Int, seed: UInt64 = baseSeed
    ) throws(LawViolation) {
        try checkJoinLaws(cases: cases, seed: seed) { rng in
            var replicas = scenario.randomReplicas(&rng)
            while replicas.count < 3 { replicas.append(scenario.makeReplica(replicas.count)) }
            return (replicas[0], replicas[1], replicas[2])
        }
    }

    /// Replicas that apply each other's deltas in random order, with duplicates and losses,
    /// then run anti-entropy, end equal — and with equal digests where the type has one.
    package static func checkConvergence<State>(
        _ scenario: ReplicationScenario<State>, runs: Int, seed: UInt64 = baseSeed
    ) throws(LawViolation) {
        for index in 0..<UInt64(runs) {
            let runSeed = seed &+ index
            var rng = SeededGenerator(seed: runSeed)
            var replicas = scenario.randomReplicas(&rng)
            scenario.reconcile(&replicas)
            for other in replicas.dropFirst() where other != replicas[0] {
                throw LawViolation(law: "convergence", seed: runSeed, detail: "replicas differ after anti-entropy")
            }
            if let digest = scenario.digest {
                let digests = Set(replicas.map(digest))
                guard digests.count == 1 else {
                    throw LawViolation(law: "convergence", seed: runSeed, detail: "equal states, different digests \(digests)")
                }
            }
        }
    }

    /// For reachable states `a`, `b`: `b ⊔ a.delta(missingFrom: b.context) == b ⊔ a`.
    package static func checkExtraction<State: AntiEntropyCRDT & Sendable>(
        _ scenario: ReplicationScenario<State>, cases: Int, seed: UInt64 = baseSeed
    ) throws(LawViolation) {
        for index in 0..<UInt64(cases) {
            let caseSeed = seed &+ index
            var rng = SeededGenerator(seed: caseSeed)
            let replicas = scenario.randomReplicas(&rng)
            for a in replicas.indices {
                for b in replicas.indices where a != b {
                    let extracted = replicas[a].delta(missingFrom: replicas[b].context)
                    guard replicas[b].merged(with: extracted) == replicas[b].merged(with: replicas[a]) else {
                        throw LawViolation(law: "extraction", seed: caseSeed,
                                           detail: "b ⊔ extract(a, b.context) != b ⊔ a for replicas \(a), \(b)")
                    }
                }
            }
        }
    }
}
