@_spi(Engine) import PeerSyncCRDT
import PeerSyncTestSupport
import Testing

/// Compaction at causal stability: the meet of contexts, the two-round stable frontier, the
/// purge, and randomized replication with compaction interleaved (issue 13).
/// A compaction law that failed, with the seed that replays it (`PEERSYNC_SEED`).
struct CompactionViolation: Error, CustomStringConvertible {
    let law: String
    let seed: UInt64
    let detail: String

    var description: String { "\(law) violated — replay with PEERSYNC_SEED=\(seed): \(detail)" }
}

@Suite("Compaction", .computeLane)
struct CompactionTests {
    // MARK: - Contexts

    /// Every dot of `context` with counter ≤ `bound` (brute force, for small contexts).
    static func dots(_ context: CausalContext, replicas: Int, bound: UInt64) -> Set<Dot> {
        var result: Set<Dot> = []
        for r in 0..<replicas {
            for c in 1...bound where context.contains(Dot(replica: testReplica(r), counter: c)) {
                result.insert(Dot(replica: testReplica(r), counter: c))
            }
        }
        return result
    }

    static func randomContext(_ rng: inout SeededGenerator) -> CausalContext {
        var context = CausalContext()
        for _ in 0..<Int.random(in: 0..<20, using: &rng) {
            context.insert(Dot(replica: testReplica(Int.random(in: 0..<3, using: &rng)), counter: UInt64.random(in: 1...12, using: &rng)))
        }
        return context
    }

    @Test("meet and restriction are set intersection and filter, in canonical form")
    func meetIsIntersection() {
        for index in 0..<UInt64(2_000) {
            let seed = baseSeed &+ index
            var rng = SeededGenerator(seed: seed)
            let a = Self.randomContext(&rng), b = Self.randomContext(&rng), c = Self.randomContext(&rng)
            let meet = CausalContext.meet(of: [a, b, c])
            let expected = Self.dots(a, replicas: 3, bound: 12).intersection(Self.dots(b, replicas: 3, bound: 12))
                .intersection(Self.dots(c, replicas: 3, bound: 12))
            #expect(meet == CausalContext(dots: expected), "seed \(seed)")
            #expect(a.intersection(b) == b.intersection(a), "seed \(seed)")
            let own: Set<ReplicaID> = [testReplica(1)]
            #expect(a.restricted(to: own) == CausalContext(dots: Self.dots(a, replicas: 3, bound: 12).filter { $0.replica == testReplica(1) }),
                    "seed \(seed)")
        }
        #expect(CausalContext.meet(of: [CausalContext]()).isEmpty)
    }

    // MARK: - The frontier

    @Test("a meet becomes stable only once every write concurrent with it is seen by all")
    func twoRounds() {
        let (a, b, c) = (testReplica(0), testReplica(1), testReplica(2))
        // b deleted (b:1) after a's write a:1; c wrote c:1 before it saw b:1, and c:1 has reached nobody yet.
        let seenA = CausalContext(dots: [Dot(replica: a, counter: 1), Dot(replica: b, counter: 1)])
        let seenB = seenA
        let seenC = CausalContext(dots: [Dot(replica: a, counter: 1), Dot(replica: b, counter: 1), Dot(replica: c, counter: 1)])
        func views(_ sa: CausalContext, _ sb: CausalContext, _ sc: CausalContext) -> [ReplicaID: MemberView] {
            [a: MemberView(seen: sa, ownReplicas: [a]), b: MemberView(seen: sb, ownReplicas: [b]), c: MemberView(seen: sc, ownReplicas: [c])]
        }
        var frontier = CompactionFrontier()
        var grew = frontier.advance(members: views(seenA, seenB, seenC))
        #expect(!grew)
        #expect(frontier.stable.isEmpty)  // the meet holds b:1, but c:1 is still on its way
        #expect(frontier.candidate?.writers.contains(Dot(replica: c, counter: 1)) == true)
        grew = frontier.advance(members: views(seenA, seenB, seenC))
        #expect(!grew)
        // Everyone has seen b:1; what waits is c's write c:1, which a and b have not seen yet.
        #expect(CompactionFrontier.holdingBack(CausalContext(dots: [Dot(replica: b, counter: 1)]), members: views(seenA, seenB, seenC)) == [a, b])
        // Once everyone has c:1, the first meet is stable (and a new candidate waits).
        grew = frontier.advance(members: views(seenC, seenC, seenC))
        #expect(grew)
        #expect(frontier.stable == seenA)
        grew = frontier.advance(members: views(seenC, seenC, seenC))
        #expect(grew)
        #expect(frontier.stable == seenC)
    }

    @Test("a member that saw nothing holds everything back; a member set change drops the candidate")
    func membersHoldBack() {
        let (a, b, t) = (testReplica(0), testReplica(1), testReplica(2))
        let seen = CausalContext(versionVector: [a: 5, b: 3])
        var members: [ReplicaID: MemberView] = [
            a: MemberView(seen: seen, ownReplicas: [a]), b: MemberView(seen: seen, ownReplicas: [b]),
            t: MemberView(seen: CausalContext(), ownReplicas: [t]),
        ]
        var frontier = CompactionFrontier()
        for _ in 0..<3 { frontier.advance(members: members) }
        #expect(frontier.stable.isEmpty)
        #expect(CompactionFrontier.holdingBack(seen, members: members) == [t])
        members[t] = nil  // the tablet is removed
        for _ in 0..<2 { frontier.advance(members: members) }
        #expect(frontier.stable == seen)
    }

    @Test("a device's incarnations count as one member; its old replica's writes are its own")
    func incarnations() {
        let (a, old, new) = (testReplica(0), testReplica(1), testReplica(2))
        // The device wrote as `old`, then continued as `new`; its report (as `new`) includes old:4.
        let seen = CausalContext(versionVector: [a: 2, old: 4, new: 1])
        let members: [ReplicaID: MemberView] = [
            a: MemberView(seen: seen, ownReplicas: [a]),
            new: MemberView(seen: seen, ownReplicas: [old, new]),
        ]
        var frontier = CompactionFrontier()
        frontier.advance(members: members)
        #expect(frontier.candidate?.writers == seen)
        frontier.advance(members: members)
        #expect(frontier.stable == seen)
    }

    @Test("joining frontiers unions their stable contexts")
    func frontierJoin() {
        var x = CompactionFrontier(stable: CausalContext(versionVector: [testReplica(0): 3]))
        let y = CompactionFrontier(stable: CausalContext(versionVector: [testReplica(0): 1, testReplica(1): 2]))
        x.merge(y)
        #expect(x.stable == CausalContext(versionVector: [testReplica(0): 3, testReplica(1): 2]))
    }

    // MARK: - Purge

    @Test("purge removes exactly the invisible records whose dots are all stable, and keeps the digest exact")
    func purgeRemovesStableDeletes() throws {
        let (a, b) = (testReplica(0), testReplica(1))
        let keys = (0..<4).map { RecordKey(collection: "c", id: UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, UInt8($0)))) }
        var map = RecordMap()
        var clock = HybridLogicalClock(physicalClock: { 1_000 })
        for key in keys { try map.write(["x": .int(1)], to: key, at: clock.tick(), by: a) }  // a:1...4
        let beforeDeletes = map
        try map.remove(keys[0], by: b)  // b:1
        try map.remove(keys[1], by: b)  // b:2
        try map.remove(keys[2], by: b)  // b:3
        // Stable: all of a, but only b:1 and b:2 (b:3 not yet).
        let stable = CausalContext(versionVector: [a: 4, b: 2])
        #expect(Set(map.purgeableKeys(stable: stable)) == [keys[0], keys[1]])
        let contextBefore = map.context
        let result = map.purge(stable: stable)
        #expect(Set(result.keys) == [keys[0], keys[1]])
        #expect(result.fieldCount == 2 && result.presenceCount == 2)
        #expect(map.record(keys[0]) == nil && map.record(keys[2]) != nil && map.record(keys[3])?.isVisible == true)
        #expect(map.context == contextBefore)
        #expect(map.digest == RecordMap(records: map.allRecords, context: map.context).digest)
        #expect(map.purge(stable: stable).isEmpty)
        // Echoes of the purged records (a late delta, a stale full state) are dropped.
        var afterEcho = map
        afterEcho.apply(beforeDeletes)
        #expect(afterEcho.record(keys[0]) == nil && afterEcho.record(keys[1]) == nil)
        #expect(afterEcho == map && afterEcho.digest == map.digest)
    }

    @Test("a dot issued twice (a restored store wrote again) is a collision, not an echo: each side takes the other's record")
    func reissuedDotIsNotAnEcho() throws {
        let (old, b) = (testReplica(0), testReplica(1))
        let key = { (n: UInt8) in RecordKey(collection: "c", id: UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, n))) }
        var clock = HybridLogicalClock(physicalClock: { 1_000 })
        var backup = RecordMap()
        try backup.write(["x": .int(0)], to: key(0), at: clock.tick(), by: old)  // old:1
        var original = backup
        try original.write(["x": .int(1)], to: key(1), at: clock.tick(), by: old)  // old:2, "one"
        var restored = backup
        try restored.write(["x": .int(2)], to: key(2), at: clock.tick(), by: old)  // old:2 again
        // A deleted record of b's, purged on both sides: its echo must still be dropped.
        var deleted = RecordMap()
        try deleted.write(["x": .int(3)], to: key(3), at: clock.tick(), by: b)  // b:1
        try deleted.remove(key(3), by: b)  // b:2
        original.apply(deleted)
        restored.apply(deleted)
        let stable = CausalContext(versionVector: [old: 2, b: 2])
        #expect(original.purge(stable: stable).keys == [key(3)] && restored.purge(stable: stable).keys == [key(3)])
        var a = restored
        a.apply(original)
        var other = original
        other.apply(restored)
        #expect(a.record(key(1))?.isVisible == true && a.record(key(2))?.isVisible == true)
        #expect(other.record(key(1))?.isVisible == true && other.record(key(2))?.isVisible == true)
        #expect(a == other && a.digest == other.digest)
        a.apply(deleted)
        #expect(a.record(key(3)) == nil)
    }

    // MARK: - Randomized replication with compaction

    struct Node {
        var state = RecordMap()
        /// replica → the context it reported (own entry: the current context, refreshed on use).
        var seen: [ReplicaID: CausalContext] = [:]
        var frontier = CompactionFrontier()
        var purged: Set<RecordKey> = []
        var online = true
        var purgeCount = 0
    }

    enum Payload {
        case delta(RecordMap)
        case gossip([ReplicaID: CausalContext], stable: CausalContext)
    }

    struct Message {
        let source: Int
        let target: Int
        let payload: Payload
    }

    struct Simulation {
        var nodes: [Node]
        var inFlight: [Message] = []
        var members: Set<Int>
        var departed = CausalContext()
        var nextID: UInt16 = 0
        var clock: UInt64 = 1_000
        let seed: UInt64
        /// Every delta any replica made, joined, never compacted: what replicas must show.
        var reference = RecordMap()

        init(replicas: Int, seed: UInt64) {
            nodes = Array(repeating: Node(), count: replicas)
            members = Set(0..<replicas)
            self.seed = seed
        }

        func replica(_ i: Int) -> ReplicaID { testReplica(i) }

        mutating func send(_ payload: Payload, from source: Int, to target: Int, _ rng: inout SeededGenerator, lossy: Bool = true) {
            if lossy && rng.chance(0.15) { return }
            inFlight.append(Message(source: source, target: target, payload: payload))
            if lossy && rng.chance(0.15) { inFlight.append(Message(source: source, target: target, payload: payload)) }
        }

        /// One local operation at node `i`: a write to a record it sees (or a new one), or a delete.
        mutating func mutate(_ i: Int, _ rng: inout SeededGenerator) throws {
            var visible: [RecordKey] = []
            for (collection, records) in nodes[i].state.collections {
                for (id, record) in records where record.isVisible { visible.append(RecordKey(collection: collection, id: id)) }
            }
            // Dictionary order differs between runs; sort (cheaply: IDs differ in their last two bytes) to replay.
            visible.sort { (($0.collection == "a" ? 0 : 1), $0.id.uuid.14, $0.id.uuid.15) < (($1.collection == "a" ? 0 : 1), $1.id.uuid.14, $1.id.uuid.15) }
            let delta: RecordMap?
            if !visible.isEmpty, rng.chance(0.35) {
                delta = try nodes[i].state.remove(visible.randomElement(using: &rng)!, by: replica(i))
            } else {
                let key: RecordKey
                if !visible.isEmpty, rng.chance(0.5) {
                    key = visible.randomElement(using: &rng)!
                } else {
                    nextID &+= 1
                    key = RecordKey(collection: ["a", "b"].randomElement(using: &rng)!,
                                    id: UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, UInt8(nextID >> 8), UInt8(nextID & 0xff))))
                }
                clock += 1
                var hlc = HybridLogicalClock(latest: nodes[i].state.maxTimestamp, physicalClock: { [clock] in clock })
                var fields: [String: FieldValue] = [:]
                for name in ["x", "y", "z"] where rng.chance(0.5) { fields[name] = .int(Int64.random(in: 0..<5, using: &rng)) }
                if fields.isEmpty { fields["x"] = .int(0) }
                delta = try nodes[i].state.write(fields, to: key, at: hlc.tick(), by: replica(i))
            }
            guard let delta else { return }
            reference.apply(delta)
            for target in nodes.indices where target != i { send(.delta(delta), from: i, to: target, &rng) }
        }

        /// Node `i` tells `target` what every replica has seen, as far as it knows, and its stable context.
        mutating func gossip(_ i: Int, to target: Int, _ rng: inout SeededGenerator, lossy: Bool = true) {
            nodes[i].seen[replica(i)] = nodes[i].state.context
            send(.gossip(nodes[i].seen, stable: nodes[i].frontier.stable), from: i, to: target, &rng, lossy: lossy)
        }

        mutating func deliver(_ message: Message) throws(CompactionViolation) {
            let t = message.target
            guard nodes[t].online else { return }
            switch message.payload {
            case .delta(let delta):
                nodes[t].state.apply(delta)
                for (collection, records) in delta.collections {
                    for id in records.keys {
                        let key = RecordKey(collection: collection, id: id)
                        if nodes[t].purged.contains(key), nodes[t].state.record(key) != nil {
                            throw CompactionViolation(law: "a purged record never reappears", seed: seed,
                                               detail: "\(key) came back at replica \(t) from replica \(message.source)")
                        }
                    }
                }
            case .gossip(let seen, let stable):
                for (replica, context) in seen { nodes[t].seen[replica, default: CausalContext()].merge(context) }
                nodes[t].frontier.merge(CompactionFrontier(stable: stable))
            }
        }

        /// Node `i` advances its frontier and purges what is stable.
        mutating func compact(_ i: Int) throws(CompactionViolation) {
            nodes[i].seen[replica(i)] = nodes[i].state.context
            var views: [ReplicaID: MemberView] = [:]
            for m in members {
                views[replica(m)] = MemberView(seen: nodes[i].seen[replica(m)] ?? CausalContext(), ownReplicas: [replica(m)])
            }
            nodes[i].frontier.advance(members: views, departed: departed)
            let stable = nodes[i].frontier.stable
            if !nodes[i].state.context.includes(stable) {
                throw CompactionViolation(law: "the stable context is below the local context", seed: seed, detail: "replica \(i)")
            }
            let result = nodes[i].state.purge(stable: stable)
            nodes[i].purged.formUnion(result.keys)
            nodes[i].purgeCount += result.keys.count
            compactions += 1
            if compactions % 16 == 0 { try checkDigest(i) }
        }

        var compactions = 0

        func checkDigest(_ i: Int) throws(CompactionViolation) {
            if nodes[i].state.digest != RecordMap(records: nodes[i].state.allRecords, context: nodes[i].state.context).digest {
                throw CompactionViolation(law: "purge keeps the digest exact", seed: seed, detail: "replica \(i)")
            }
        }

        /// One random step: an operation, a delivery, anti-entropy, a stale full state, gossip or
        /// compaction. Returns whether it was an operation.
        @discardableResult
        mutating func step(operate: Bool, _ rng: inout SeededGenerator) throws -> Bool {
            let online = nodes.indices.filter { nodes[$0].online }
            let roll = Double.random(in: 0..<1, using: &rng)
            if operate, roll < 0.35 {
                try mutate(online.randomElement(using: &rng)!, &rng)
                return true
            } else if roll < 0.75, !inFlight.isEmpty {
                try deliver(inFlight.remove(at: Int.random(in: 0..<inFlight.count, using: &rng)))
            } else if roll < 0.82, online.count > 1 {
                let (from, to) = Self.pair(online, &rng)
                send(.delta(nodes[from].state.delta(missingFrom: nodes[to].state.context)), from: from, to: to, &rng)  // computed now, delivered later
            } else if roll < 0.84, online.count > 1 {
                let (from, to) = Self.pair(online, &rng)
                send(.delta(nodes[from].state), from: from, to: to, &rng)  // a full state (a repair), possibly stale on arrival
            } else if roll < 0.93, online.count > 1 {
                let (from, to) = Self.pair(online, &rng)
                gossip(from, to: to, &rng)
            } else {
                try compact(online.randomElement(using: &rng)!)
            }
            return false
        }

        static func pair(_ online: [Int], _ rng: inout SeededGenerator) -> (Int, Int) {
            let from = online.randomElement(using: &rng)!
            var to = online.randomElement(using: &rng)!
            while to == from { to = online.randomElement(using: &rng)! }
            return (from, to)
        }

        /// Delivers everything, then exchanges state and gossip between all online members
        /// without loss until nothing changes, compacting as it goes.
        mutating func settle() throws {
            while !inFlight.isEmpty { try deliver(inFlight.removeFirst()) }
            let live = members.sorted().filter { nodes[$0].online }
            var rng = SeededGenerator(seed: seed)
            for _ in 0..<6 {
                for from in live {
                    for to in live where to != from {
                        try deliver(Message(source: from, target: to, payload: .delta(nodes[from].state.delta(missingFrom: nodes[to].state.context))))
                    }
                }
                for from in live {
                    for to in live where to != from {
                        gossip(from, to: to, &rng, lossy: false)
                    }
                }
                while !inFlight.isEmpty { try deliver(inFlight.removeFirst()) }
                for i in live { try compact(i) }
            }
        }
    }

    /// Visible records with their values: what an app sees.
    static func visibleContent(_ map: RecordMap) -> [RecordKey: [String: FieldValue]] {
        var result: [RecordKey: [String: FieldValue]] = [:]
        for (key, state) in map.allRecords where state.isVisible { result[key] = state.values }
        return result
    }

    /// Runs one scenario and checks convergence: equal states and digests, no invisible record
    /// left, and the same visible content as replicas that never compacted would have.
    static func check(_ sim: inout Simulation, reference: RecordMap) throws {
        try sim.settle()
        let live = sim.members.sorted().filter { sim.nodes[$0].online }
        let first = sim.nodes[live[0]].state
        for i in live {
            try sim.checkDigest(i)
            let state = sim.nodes[i].state
            guard state == first, state.digest == first.digest else {
                throw CompactionViolation(law: "join with compaction interleaved converges", seed: sim.seed,
                                   detail: "replica \(i) differs from replica \(live[0]) (records \(state.recordCount) vs \(first.recordCount))")
            }
            guard state.invisibleRecordCount == 0 else {
                throw CompactionViolation(law: "every stable delete is purged once all members are up to date", seed: sim.seed,
                                   detail: "replica \(i) still holds \(state.invisibleRecordCount) deleted records")
            }
        }
        guard visibleContent(first) == visibleContent(reference), first.context == reference.context else {
            throw CompactionViolation(law: "compaction changes nothing an app sees", seed: sim.seed,
                               detail: "visible records \(visibleContent(first).count) vs \(visibleContent(reference).count) without compaction")
        }
    }

    @Test("join with compaction interleaved converges; purged records never reappear (random delivery, duplicates, losses)")
    func randomizedConvergence() throws {
        var purgedTotal = 0
        for index in 0..<UInt64(60) {
            let seed = baseSeed &+ index
            var rng = SeededGenerator(seed: seed)
            var sim = Simulation(replicas: Int.random(in: 2...4, using: &rng), seed: seed)
            for step in 0..<400 { try sim.step(operate: step < 300, &rng) }
            try Self.check(&sim, reference: sim.reference)
            purgedTotal += sim.nodes.reduce(0) { $0 + $1.purgeCount }
        }
        #expect(purgedTotal > 500, "the scenarios must actually purge")
    }

    @Test("a replica away for thousands of changes holds compaction back, then catches up; removing it instead releases it")
    func longOffline() throws {
        for (variant, index) in [("returns", UInt64(0)), ("removed", UInt64(1))] {
            let seed = baseSeed &+ 7_000 &+ index
            var rng = SeededGenerator(seed: seed)
            var sim = Simulation(replicas: 4, seed: seed)
            // Warm up with everyone online.
            for _ in 0..<300 { try sim.step(operate: true, &rng) }
            // Replica 3 goes away (what is on its way to it is lost; what it sent still travels).
            sim.nodes[3].online = false
            let awayContext = sim.nodes[3].state.context
            let ownBefore = sim.nodes[3].state.context.maxCounter(of: testReplica(3))
            var operations = 0
            var steps = 0
            while operations < 2_000, steps < 100_000 {
                steps += 1
                if try sim.step(operate: true, &rng) { operations += 1 }
                // Every purge so far only covers what the away replica had seen.
                for i in 0...2 where !awayContext.includes(sim.nodes[i].frontier.stable) {
                    throw CompactionViolation(law: "an away member holds compaction back", seed: seed, detail: "replica \(i) compacted past it")
                }
            }
            #expect(operations == 2_000)
            #expect(sim.nodes[0...2].allSatisfy { $0.state.invisibleRecordCount > 50 }, "deletes pile up while replica 3 is away (seed \(seed))")
            let needed = sim.nodes[0].state.unstableDeletedFrontier(stable: sim.nodes[0].frontier.stable)
            var views: [ReplicaID: MemberView] = [:]
            sim.nodes[0].seen[testReplica(0)] = sim.nodes[0].state.context
            for m in 0..<4 { views[testReplica(m)] = MemberView(seen: sim.nodes[0].seen[testReplica(m)] ?? CausalContext(), ownReplicas: [testReplica(m)]) }
            #expect(CompactionFrontier.holdingBack(needed, members: views).contains(testReplica(3)), "seed \(seed)")
            if variant == "returns" {
                sim.nodes[3].online = true
                #expect(sim.nodes[3].state.context.maxCounter(of: testReplica(3)) == ownBefore)
            } else {
                // Removed: its messages still in flight are refused past the cutoff (modelled as
                // lost); its writes any member holds are the departed frontier.
                sim.members.remove(3)
                sim.inFlight.removeAll { $0.source == 3 || $0.target == 3 }
                var departed = CausalContext()
                for i in 0...2 { departed.merge(sim.nodes[i].state.context.restricted(to: [testReplica(3)])) }
                sim.departed = departed
            }
            let reference = variant == "returns" ? sim.reference : Self.joinOfMembers(sim)
            try Self.check(&sim, reference: reference)
            #expect(sim.nodes[0].purgeCount > 100, "seed \(seed)")
        }
    }

    /// The join of the remaining members' states (a removed member's unshared writes are gone).
    static func joinOfMembers(_ sim: Simulation) -> RecordMap {
        var result = RecordMap()
        for i in sim.members { result.merge(sim.nodes[i].state) }
        return result
    }
}
