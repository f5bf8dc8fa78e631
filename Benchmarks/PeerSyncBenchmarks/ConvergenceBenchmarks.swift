import Foundation
import PeerSync
@_spi(Engine) import PeerSyncCRDT
import PeerSyncWire
import Synchronization
import ShiftSchedulerModel

// Convergence benchmarks (issue "Convergence benchmarks"): replicas in one process over
// loopback TCP + TLS, each workload run once with `.deltas` (catch-up of what a peer lacks, then
// deltas) and once with `.fullState` (every catch-up and change ships the whole state) — the
// same SyncNode code path, one switch. Metrics are prefixed `deltas_` / `fullstate_`.
// Records are the 6-field shift types of `workloadRecord` (SyncBenchmarks.swift).

let transfers: [TransferMode] = [.deltas, .fullState]
let durationField = "duration"

/// Copies `source`'s full state into `target` without the network (replicas that "start equal").
func seedEqual(_ target: ReplicaStore, from source: ReplicaStore) throws {
    _ = try target.applyRemote(source.state.delta(missingFrom: CausalContext()), from: "seed")
}

func workloadKey() -> RecordKey { RecordKey(collection: ShiftType.collection, id: UUID()) }

/// `state` as a state of its own: its collections' dictionaries, digest and dot index built
/// anew, so an in-memory measurement that joins into it times the join, not the copy-on-write
/// of the whole state at its first change. (Each record's field and presence arrays are still
/// shared until the join first changes that record, as in any store's state: ~4 % of W2's
/// apply, in both this copy and the shared state.)
func ownCopy(of state: ReplicaState) -> ReplicaState {
    ReplicaState(replicaID: state.replicaID, name: state.name,
                 records: RecordMap(records: state.records.allRecords, context: state.context),
                 localSettings: state.localSettings, conflicts: state.conflicts)
}

enum ConvergenceBenchmarks {
    /// W1: A holds N records; a fresh replica connects and receives the full state.
    static let w1FullState = Benchmark(name: "w1-full-state") { quick in
        try await measured {
            let records = quick ? 200 : 10_000
            var metrics: [String: Double] = [:]
            for transfer in transfers {
                let secret = BenchGroup()
                let a = try await PeerUnderTest.start("a", secret: secret, transfer: transfer)
                let b = try await PeerUnderTest.start("b", secret: secret, transfer: transfer)
                try fill(a.store, records: records, seed: 11)
                let start = ContinuousClock.now
                await b.node.addPeer(.loopback(a.port))
                let converged = await waitUntil(.seconds(quick ? 20 : 60)) { allEqual([a, b]) }
                let elapsed = milliseconds(ContinuousClock.now - start)
                let traffic = await totalTraffic([a, b])
                await a.stop()
                await b.stop()
                guard converged else { throw BenchmarkFailure("w1 (\(transfer.label)): fresh replica did not converge") }
                let p = transfer.label
                metrics["\(p)_converge_ms"] = elapsed
                metrics["\(p)_bytes_per_record"] = Double(traffic.bytes) / Double(records)
                metrics["\(p)_messages"] = Double(traffic.messages)
            }
            return Result(name: "w1-full-state",
                          detail: "A holds \(records) records; a fresh replica connects (TLS) → full state committed, digests equal; bytes both directions",
                          metrics: metrics)
        }
    }

    /// W2: A and B start equal and connected; A makes single-field updates on random records,
    /// one commit each, as fast as it can commit, streamed to B.
    static let w2Stream = Benchmark(name: "w2-stream") { quick in
        try await measured {
            let records = quick ? 200 : 10_000
            var metrics: [String: Double] = [:]
            var details: [String] = []
            // Deltas twice: on the machine as it is, and with another process loading it (a busy
            // loop, i.e. one of the 2 cores taken).
            for (transfer, loaded) in [(TransferMode.deltas, false), (.deltas, true), (.fullState, false)] {
                let burner = loaded ? try CPUBurner() : nil
                defer { burner?.stop() }
                // Full-state sync ships all `records` per update: a few updates show its cost.
                let updates = transfer == .deltas ? (quick ? 200 : 10_000) : (quick ? 10 : 50)
                let secret = BenchGroup()
                let a = try await PeerUnderTest.start("a", secret: secret, transfer: transfer)
                let b = try await PeerUnderTest.start("b", secret: secret, transfer: transfer)
                try fill(a.store, records: records, seed: 21)
                try seedEqual(b.store, from: a.store)
                let events = b.node.events()
                await b.node.addPeer(.loopback(a.port))
                guard await connectMeshWait([a, b], timeout: .seconds(10)) else {
                    await a.stop(); await b.stop()
                    throw BenchmarkFailure("w2 (\(transfer.label)): no session")
                }
                // The first exchange (each side's own roster entries) is over before the stream
                // starts: on a loaded machine it otherwise lands in the first measured updates.
                guard await waitUntil(.seconds(30), { allEqual([a, b]) }) else {
                    await a.stop(); await b.stop()
                    throw BenchmarkFailure("w2 (\(transfer.label)): the first exchange did not finish")
                }
                let tracker = VisibilityTracker()
                let store = b.store
                let watcher = Task {
                    for await event in events {
                        let keys: [RecordKey]
                        switch event {
                        case .remoteChange(let outcome, _): keys = Array(outcome.changedRecords)
                        case .catchUpProgress: keys = tracker.pendingKeys
                        default: continue
                        }
                        let now = ContinuousClock.now
                        let state = store.state
                        for key in keys {
                            if case .int(let version)? = state.records.record(key)?.fields[durationField]?.value {
                                tracker.seen(key, version: version, at: now)
                            }
                        }
                    }
                }
                let keys = Array(a.store.state.records.records(in: ShiftType.collection).keys)
                let base = a.store.state
                var deltas: [RecordMap] = []
                var rng = BenchRNG(state: 22)
                let before = await totalTraffic([a, b])
                let beforeByMessage = await frameBytesByMessage([a, b])
                var curve: [(ops: Int, bytes: Int)] = [(0, 0)]
                let step = max(1, updates / 10)
                let start = ContinuousClock.now
                let writer = WriterThread()
                for first in stride(from: 0, to: updates, by: step) {
                    // A's commits block (each fsyncs): they run on a thread of their own, as an
                    // app's blocking work must, not on the cooperative pool the nodes run on.
                    let range = first..<min(first + step, updates)
                    let (written, next) = try await writer.run { [rng, a] in
                        var rng = rng
                        var written: [RecordMap] = []
                        for i in range {
                            let key = RecordKey(collection: ShiftType.collection, id: keys.randomElement(using: &rng)!)
                            let version = Int64(1_000_000 + i)
                            // Announced before the write: the node ships it from the store's
                            // commit feed, and B may see it before `write` returns.
                            tracker.expect(key, version: version)
                            let delta = try a.store.write({ $0.upsert([durationField: .int(version)], to: key) })
                            tracker.committed(key, version: version, at: ContinuousClock.now, wrote: delta != nil)
                            if let delta { written.append(delta) }
                        }
                        return (written, rng)
                    }
                    deltas += written
                    rng = next
                    // Cumulative bytes once B has seen every update so far (a short pause in the stream).
                    _ = await waitUntil(.seconds(10)) { tracker.pendingKeys.isEmpty }
                    curve.append((range.upperBound, await totalTraffic([a, b]).bytes - before.bytes))
                }
                let converged = await waitUntil(.seconds(quick ? 20 : 120)) {
                    tracker.pendingKeys.isEmpty && allEqual([a, b])
                }
                let elapsed = milliseconds(ContinuousClock.now - start)
                let after = await totalTraffic([a, b])
                let afterByMessage = await frameBytesByMessage([a, b])
                watcher.cancel()
                await a.stop()
                await b.stop()
                guard converged else { throw BenchmarkFailure("w2 (\(transfer.label)): B did not converge") }
                // The same deltas joined into B's starting state, in memory only. The state is a
                // copy of its own, made before the clock starts, as pycrdt_bench.w2 builds its doc
                // from the start update untimed (issue 30): `var sink = base` shared base's
                // storage, so the first apply copied (copy-on-write) all 10,000 records inside the
                // timed region. Median of 5 after a warm-up, as pycrdt takes the median of 5.
                var applySamples: [Double] = []
                for round in 0...(quick ? 1 : 5) {
                    var sink = ownCopy(of: base)
                    let t = ContinuousClock().measure { for delta in deltas { sink.apply(delta) } }
                    if round > 0 { applySamples.append(milliseconds(t)) }
                }
                let applyMs = applySamples.sorted()[applySamples.count / 2]
                let samples = tracker.samples
                let p = transfer.label + (loaded ? "_loaded" : "")
                metrics["\(p)_updates"] = Double(updates)
                metrics["\(p)_converge_ms"] = elapsed
                metrics["\(p)_p50_ms"] = percentile(samples, 0.5)
                metrics["\(p)_p99_ms"] = percentile(samples, 0.99)
                metrics["\(p)_bytes_per_op"] = Double(after.bytes - before.bytes) / Double(updates)
                metrics["\(p)_messages_per_op"] = Double(after.messages - before.messages) / Double(updates)
                // What the bytes per update are made of (frame bytes; the rest is TLS records).
                for (name, sent) in frameBytesSent(from: beforeByMessage, to: afterByMessage) {
                    metrics["\(p)_frame_bytes_per_op_\(name)"] = Double(sent) / Double(updates)
                }
                metrics["\(p)_apply_in_memory_ms"] = applyMs
                for point in curve.dropFirst() { metrics["\(p)_curve_bytes_at_\(point.ops)"] = Double(point.bytes) }
                details.append("\(p): \(updates) updates")
            }
            return Result(name: "w2-stream",
                          detail: "A streams single-field updates (one commit each) on a \(records)-record collection to B (\(details.joined(separator: ", "))); latency = A commit → visible on B",
                          metrics: metrics)
        }
    }

    /// W3: three replicas start equal and connected; the sessions stop (partition), each makes
    /// updates, deletes and inserts; new sessions start (heal) and they converge.
    static let w3Partition = Benchmark(name: "w3-partition") { quick in
        try await measured {
            let records = quick ? 200 : 10_000
            let (updates, deletes, inserts) = quick ? (40, 4, 4) : (2_000, 200, 200)
            var metrics: [String: Double] = [:]
            for transfer in transfers {
                let secret = BenchGroup()
                var peers: [PeerUnderTest] = []
                for name in ["a", "b", "c"] { peers.append(try await PeerUnderTest.start(name, secret: secret, transfer: transfer)) }
                try fill(peers[0].store, records: records, seed: 31)
                try seedEqual(peers[1].store, from: peers[0].store)
                try seedEqual(peers[2].store, from: peers[0].store)
                guard await connectMesh(peers, timeout: .seconds(10)) else {
                    for p in peers { await p.stop() }
                    throw BenchmarkFailure("w3 (\(transfer.label)): mesh did not connect")
                }
                // Partition: every session ends; each replica edits alone.
                for p in peers { await p.stop(keepStore: true) }
                let keys = Array(peers[0].store.state.records.records(in: ShiftType.collection).keys)
                for (index, peer) in peers.enumerated() {
                    var rng = BenchRNG(state: 300 + UInt64(index))
                    var shuffled = keys.shuffled(using: &rng)
                    for _ in 0..<deletes {
                        let key = RecordKey(collection: ShiftType.collection, id: shuffled.removeLast())
                        _ = try peer.store.write { $0.delete(key) }
                    }
                    for i in 0..<updates {
                        let key = RecordKey(collection: ShiftType.collection, id: shuffled[i % shuffled.count])
                        let field = ["title", "symbol", durationField, "description"][i % 4]
                        let value: FieldValue = field == durationField ? .int(Int64(index * 100_000 + i))
                            : .string("\(field) \(index)-\(i)")
                        _ = try peer.store.write { $0.upsert([field: value], to: key) }
                    }
                    for i in 0..<inserts {
                        _ = try peer.store.write { $0.write(workloadRecord(records + i, &rng), to: workloadKey()) }
                    }
                }
                // The same merge in memory only: each replica joins what the others have that it lacks
                // (median of 5 after a warm-up, into fresh copies — as Benchmarks/compare does).
                let states = peers.map(\.store.state)
                var mergeSamples: [Double] = []
                var extractSamples: [Double] = []
                for round in 0...(quick ? 1 : 5) {
                    var merged = states.map { s in
                        ReplicaState(replicaID: s.replicaID, name: s.name, records: RecordMap(records: s.records.allRecords, context: s.context),
                                     localSettings: [:], conflicts: ConflictLog())
                    }
                    var extracting = Duration.zero
                    let start = ContinuousClock.now
                    for i in merged.indices {
                        for j in states.indices where j != i {
                            let t = ContinuousClock.now
                            let delta = states[j].delta(missingFrom: merged[i].context)
                            extracting += ContinuousClock.now - t
                            merged[i].apply(delta)
                        }
                    }
                    let elapsed = ContinuousClock.now - start
                    precondition(merged[0].digest == merged[1].digest && merged[1].digest == merged[2].digest)
                    if round > 0 {
                        mergeSamples.append(milliseconds(elapsed))
                        extractSamples.append(milliseconds(extracting))
                    }
                }
                let mergeMs = mergeSamples.sorted()[mergeSamples.count / 2]
                let extractMs = extractSamples.sorted()[extractSamples.count / 2]
                // Heal: new sessions on the same stores.
                var healed: [PeerUnderTest] = []
                for p in peers { healed.append(try await p.restarted(secret: secret)) }
                // Where the heal's time goes: the last session up, the last chunk in, the last change applied.
                let marks = Locked<(connected: ContinuousClock.Instant?, lastChunk: ContinuousClock.Instant?, lastChange: ContinuousClock.Instant?)>((nil, nil, nil))
                let markers = healed.map { peer in
                    let events = peer.node.events()
                    return Task {
                        for await event in events {
                            let now = ContinuousClock.now
                            switch event {
                            case .peerConnected: marks.withLock { $0.connected = now }
                            case .catchUpProgress(_, let chunk, let chunks, _) where chunk == chunks: marks.withLock { $0.lastChunk = now }
                            case .remoteChange: marks.withLock { $0.lastChange = now }
                            default: continue
                            }
                        }
                    }
                }
                defer { for marker in markers { marker.cancel() } }
                let cpuBefore = Usage.cpuSeconds()
                let start = ContinuousClock.now
                for (i, peer) in healed.enumerated() {
                    for other in healed[(i + 1)...] { await peer.node.addPeer(.loopback(other.port)) }
                }
                let converged = await waitUntil(.seconds(quick ? 20 : 60)) { allEqual(healed) }
                let elapsed = milliseconds(ContinuousClock.now - start)
                // CPU the process spent healing (both cores count): near 2 × elapsed, the heal
                // is short of CPU; far below it, it waits (timers, handshakes, ordering).
                let cpuMs = (Usage.cpuSeconds() - cpuBefore) * 1000
                let traffic = await totalTraffic(healed)
                let byMessage = await frameBytesByMessage(healed)
                for p in healed { await p.stop() }
                guard converged else { throw BenchmarkFailure("w3 (\(transfer.label)): replicas did not converge after healing") }
                let ops = 3 * (updates + deletes + inserts)
                let p = transfer.label
                metrics["\(p)_converge_ms"] = elapsed
                metrics["\(p)_heal_cpu_ms"] = cpuMs
                let (connected, lastChunk, lastChange) = marks.withLock { $0 }
                if let connected { metrics["\(p)_all_connected_ms"] = milliseconds(connected - start) }
                if let lastChunk { metrics["\(p)_last_chunk_in_ms"] = milliseconds(lastChunk - start) }
                if let lastChange { metrics["\(p)_last_change_ms"] = milliseconds(lastChange - start) }
                metrics["\(p)_bytes_per_op"] = Double(traffic.bytes) / Double(ops)
                metrics["\(p)_messages"] = Double(traffic.messages)
                for (name, bytes) in byMessage where bytes > 0 {
                    metrics["\(p)_frame_bytes_per_op_\(name)"] = Double(bytes) / Double(ops)
                }
                metrics["merge_in_memory_ms"] = mergeMs
                metrics["merge_in_memory_extract_ms"] = extractMs
            }
            return Result(name: "w3-partition",
                          detail: "3 replicas of \(records) records, partitioned; each makes \(updates) updates, \(deletes) deletes, \(inserts) inserts (one commit each); heal → all digests equal (3 TLS sessions, incl. handshakes)",
                          metrics: metrics)
        }
    }

    /// W4: resident memory per record, 100k records in a replica's state.
    static let w4Memory = Benchmark(name: "w4-memory") { quick in
        try await measured {
            let records = quick ? 2_000 : 100_000
            var rng = BenchRNG(state: 41)
            let fields = (0..<records).map { workloadRecord($0, &rng) }
            let keys = (0..<records).map { _ in workloadKey() }
            let before = Usage.statusBytes("VmRSS")
            var state = ReplicaState(name: "memory")
            for i in 0..<records { state.write(fields[i], to: keys[i]) }
            let after = Usage.statusBytes("VmRSS")
            precondition(state.records.recordCount == records)
            // A store holding them, reopened: the state it loads from SQLite.
            let directory = temporaryStoreDirectory()
            defer { try? FileManager.default.removeItem(atPath: directory) }
            let store = try ReplicaStore.create(directory: directory, name: "memory")
            _ = try store.applyRemote(state.delta(missingFrom: CausalContext()), from: "seed")
            let beforeOpen = Usage.statusBytes("VmRSS")
            let reopened = try ReplicaStore.open(directory: directory)
            let afterOpen = Usage.statusBytes("VmRSS")
            precondition(reopened.state.records.recordCount == records)
            withExtendedLifetime((state, store, reopened)) {}
            return Result(name: "w4-memory",
                          detail: "VmRSS growth per record: \(records) 6-field records written into a ReplicaState (dot index included); and a store of them opened (state loaded from SQLite)",
                          metrics: ["bytes_per_record": (after - before) / Double(records),
                                    "dot_index_entries": Double(state.records.dotIndexEntryCount),
                                    "store_open_bytes_per_record": (afterOpen - beforeOpen) / Double(records)])
        }
    }

    /// Mesh: N peers, all connected, start equal; each inserts records (one commit each) at the
    /// same time; time until every digest is equal.
    static let mesh = Benchmark(name: "mesh") { quick in
        try await measured {
            let records = quick ? 50 : 200
            let edits = quick ? 5 : 20
            var metrics: [String: Double] = [:]
            // PEERSYNC_MESH_TRANSFERS=deltas runs the delta mesh only.
            let only = ProcessInfo.processInfo.environment["PEERSYNC_MESH_TRANSFERS"]
            for transfer in transfers where only.map({ $0.split(separator: ",").contains(Substring(transfer.label)) }) ?? true {
                // Full state to every peer on every edit grows as peers² × edits: stop at 8 peers.
                let sizes = quick ? [2, 4] : (transfer == .deltas ? meshSizes : [2, 4, 8])
                for n in sizes {
                    let secret = BenchGroup()
                    var peers: [PeerUnderTest] = []
                    for i in 0..<n { peers.append(try await PeerUnderTest.start("p\(i)", secret: secret, transfer: transfer)) }
                    try fill(peers[0].store, records: records, seed: 51)
                    for peer in peers.dropFirst() { try seedEqual(peer.store, from: peers[0].store) }
                    guard await connectMesh(peers, timeout: .seconds(quick ? 20 : 180)) else {
                        for p in peers { await p.stop() }
                        if quick { throw BenchmarkFailure("mesh (\(transfer.label), \(n) peers): sessions did not all establish") }
                        // A result too (an older build could not connect 64 peers): the other
                        // sizes still count, and larger ones are not tried.
                        FileHandle.standardError.write(Data("mesh (\(transfer.label), \(n) peers): sessions did not all establish within 180 s\n".utf8))
                        metrics["\(transfer.label)_\(n)p_connect_failed"] = 1
                        break
                    }
                    // Per receiver: when each other peer's insert was committed, and when it arrived.
                    let trackers = peers.map { _ in VisibilityTracker() }
                    var watchers: [Task<Void, Never>] = []
                    for (j, peer) in peers.enumerated() {
                        let events = peer.node.events()
                        let tracker = trackers[j]
                        let store = peer.store
                        watchers.append(Task {
                            for await event in events {
                                let keys: [RecordKey]
                                switch event {
                                case .remoteChange(let outcome, _): keys = Array(outcome.changedRecords)
                                case .catchUpProgress: keys = tracker.pendingKeys.filter { store.state.contains($0) }
                                default: continue
                                }
                                let now = ContinuousClock.now
                                for key in keys { tracker.seen(key, version: 0, at: now) }
                            }
                        })
                    }
                    let before = await totalTraffic(peers)
                    let beforeByMessage = await frameBytesByMessage(peers)
                    let start = ContinuousClock.now
                    let lastEdit = Locked(start)
                    let framed = Locked<[Int]>([])
                    try await withThrowingTaskGroup(of: Void.self) { group in
                        for (i, peer) in peers.enumerated() {
                            group.addTask {
                                var rng = BenchRNG(state: 500 + UInt64(i))
                                for e in 0..<edits {
                                    let key = workloadKey()
                                    let fields = workloadRecord(records + i * edits + e, &rng)
                                    // Announced before the write: the node ships it from the commit
                                    // feed, and a peer may see it before `write` returns.
                                    for (j, tracker) in trackers.enumerated() where j != i { tracker.expect(key, version: 0) }
                                    let delta = try peer.store.write({ $0.write(fields, to: key) })
                                    let now = ContinuousClock.now
                                    for (j, tracker) in trackers.enumerated() where j != i {
                                        tracker.committed(key, version: 0, at: now, wrote: delta != nil)
                                    }
                                    if let delta {
                                        lastEdit.withLock { $0 = max($0, now) }
                                        framed.withLock { $0.append(framedDeltaBytes(delta)) }  // the node ships it
                                    }
                                    await Task.yield()
                                }
                            }
                        }
                        try await group.waitForAll()
                    }
                    let converged = await waitUntil(.seconds(quick ? 20 : 120)) { allEqual(peers) }
                    let end = ContinuousClock.now
                    let elapsed = milliseconds(end - start)
                    let afterLastEdit = milliseconds(end - lastEdit.withLock { $0 })
                    _ = await waitUntil(.seconds(5)) { trackers.allSatisfy { $0.pendingKeys.isEmpty } }
                    let after = await totalTraffic(peers)
                    let afterByMessage = await frameBytesByMessage(peers)
                    // What a quiet mesh costs: after a settling second (the last digest and gossip
                    // rounds), the traffic of a window with no edits, per peer and second.
                    var idle: [String: Double] = [:]
                    if converged, transfer == .deltas {
                        try? await Task.sleep(for: quick ? .milliseconds(300) : .seconds(1))
                        let (from, fromByMessage) = (await totalTraffic(peers), await frameBytesByMessage(peers))
                        let window: Duration = quick ? .milliseconds(500) : .seconds(3)
                        try? await Task.sleep(for: window)
                        let (to, toByMessage) = (await totalTraffic(peers), await frameBytesByMessage(peers))
                        let perPeerSecond = 1 / (window.millisecondsDouble / 1_000) / Double(n)
                        idle["idle_bytes_per_s_per_peer"] = Double(to.bytes - from.bytes) * perPeerSecond
                        idle["idle_messages_per_s_per_peer"] = Double(to.messages - from.messages) * perPeerSecond
                        for (name, sent) in frameBytesSent(from: fromByMessage, to: toByMessage) {
                            idle["idle_frame_bytes_per_s_per_peer_\(name)"] = Double(sent) * perPeerSecond
                        }
                    }
                    // Each peer's own signed report (issue 32), mean over peers: the frame that
                    // carries it alone (what each peer sends each other peer in a round where it
                    // changed), the report, and its context blob.
                    let ownFrames = peers.map { ownSeenFrameBytes($0.store) }
                    let ownReports = peers.map { ownSeenReportBytes($0.store) }
                    for w in watchers { w.cancel() }
                    for p in peers { await p.stop() }
                    guard converged else { throw BenchmarkFailure("mesh (\(transfer.label), \(n) peers) did not converge") }
                    metrics["\(transfer.label)_\(n)p_seen_own_frame_bytes"] = Double(ownFrames.reduce(0, +)) / Double(n)
                    metrics["\(transfer.label)_\(n)p_seen_own_report_bytes"] = Double(ownReports.map(\.report).reduce(0, +)) / Double(n)
                    metrics["\(transfer.label)_\(n)p_seen_own_context_bytes"] = Double(ownReports.map(\.context).reduce(0, +)) / Double(n)
                    let samples = trackers.flatMap(\.samples).sorted()
                    let ops = n * edits
                    let p = "\(transfer.label)_\(n)p"
                    metrics["\(p)_converge_ms"] = elapsed
                    metrics["\(p)_after_last_edit_ms"] = afterLastEdit
                    for (name, value) in idle { metrics["\(p)_\(name)"] = value }
                    let sizes = framed.withLock { $0 }
                    let framedBytes = Double(sizes.reduce(0, +)) / Double(max(1, sizes.count))
                    metrics["\(p)_framed_delta_bytes"] = framedBytes
                    metrics["\(p)_bytes_per_op"] = Double(after.bytes - before.bytes) / Double(ops)
                    // Target: ≤ 3 × (peers × framed delta) per edit.
                    metrics["\(p)_bytes_per_op_over_peers_x_framed"] = Double(after.bytes - before.bytes) / Double(ops) / (Double(n) * framedBytes)
                    metrics["\(p)_messages"] = Double(after.messages - before.messages)
                    // What the bytes per edit are made of (frame bytes, TLS not included).
                    for (name, sent) in frameBytesSent(from: beforeByMessage, to: afterByMessage) {
                        metrics["\(p)_frame_bytes_per_op_\(name)"] = Double(sent) / Double(ops)
                    }
                    if !samples.isEmpty {
                        metrics["\(p)_p50_ms"] = percentile(samples, 0.5)
                        metrics["\(p)_p99_ms"] = percentile(samples, 0.99)
                    }
                }
            }
            return Result(name: "mesh",
                          detail: "N peers fully connected (TLS), equal at \(records) records; each inserts \(edits) records (one commit each) at once; first edit → all digests equal; latency = commit → visible on each other peer",
                          metrics: metrics)
        }
    }
}

/// Another process that keeps one core busy (`sh -c 'while :; do :; done'`) until stopped.
final class CPUBurner {
    private let process = Process()

    init() throws {
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = ["-c", "while :; do :; done"]
        try process.run()
    }

    func stop() { stopProcess(process) }
}

/// Peer counts of the mesh benchmark (`PEERSYNC_MESH_SIZES=2,4,8` to pick others).
let meshSizes: [Int] = ProcessInfo.processInfo.environment["PEERSYNC_MESH_SIZES"].map {
    $0.split(separator: ",").compactMap { Int($0) }
} ?? [2, 4, 8, 16, 32, 64]

/// The size of `delta` as a delta frame in a session whose dictionary already knows its names
/// and writer (what every edit after a session's first costs): length, type and body.
func framedDeltaBytes(_ delta: RecordMap) -> Int {
    let dictionary = WireDictionary(startingAt: HybridLogicalClock.wallClock())
    _ = WireDelta.encode(delta, with: dictionary)  // defines the names and the writer
    return Message.delta(WireDelta.encode(delta, with: dictionary)).encodedFrame().count
}

/// Waits until every node of `peers` has a session to every other (they were dialed already).
func connectMeshWait(_ peers: [PeerUnderTest], timeout: Duration) async -> Bool {
    await waitUntil(timeout) {
        for peer in peers where await peer.node.peers().count < peers.count - 1 { return false }
        return true
    }
}

/// A value behind a lock, shareable by reference between tasks.
final class Locked<Value: Sendable>: Sendable {
    private let mutex: Mutex<Value>
    init(_ value: Value) { mutex = Mutex(value) }
    func withLock<T>(_ body: (inout Value) -> T) -> T { mutex.withLock { body(&$0) } }
}
