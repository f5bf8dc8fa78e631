import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import PeerSyncStore
import PeerSyncWire

/// What hostile but well-formed input costs a node: frames shaped to hit the worst case of the
/// decoders, the join and the digest (issue 17). Every frame here is at most 4 MiB; the budget
/// is ~100 ms each in a release build. Frames over the validation limits must be refused, and
/// refused quickly.
enum HostileInputBenchmarks {
    static let hostileInput = Benchmark(name: "hostile-input") { quick in
        let wide = quick ? 2_000 : 50_000
        let rounds = quick ? 1 : 5
        var rng = BenchRNG(state: 17)
        var metrics: [String: Double] = [:]

        // A receiver holding 1,000 records written by 3 replicas.
        var receiver = ReplicaState(replicaID: ReplicaID.random(using: &rng), name: "receiver")
        var writers = (0..<3).map { ReplicaState(replicaID: ReplicaID.random(using: &rng), name: "w\($0)") }
        for i in 0..<1_000 {
            receiver.apply(writers[i % 3].write(shiftFields(i, &rng), to: RecordKey(collection: "shiftTypes", id: UUID())))
        }

        // 1. A general delta whose context names `count` replica IDs (~19 bytes each on the
        //    wire): 50,000 (issue 17's stall; now refused) and 10,000 (the limit). 2. A hello
        //    carrying the same context as a context blob.
        for (prefix, count) in [("wide", wide), ("limit", quick ? 1_000 : ValidationLimits.maxContextReplicas)] {
            var vector: [ReplicaID: UInt64] = [:]
            for _ in 0..<count { vector[ReplicaID.random(using: &rng)] = UInt64.random(in: 1...1_000, using: &rng) }
            let wideContext = CausalContext(versionVector: vector)
            let payload = WireDelta.encode(records: [(RecordKey, RecordState)](), context: wideContext,
                                           with: WireDictionary(startingAt: 1_700_000_000_000))
            var decoded: RecordMap?
            metrics["\(prefix)_delta_decode_ms"] = medianMilliseconds(rounds: rounds) {
                decoded = try? WireDelta.decode(payload, with: WireDictionary(startingAt: 1_700_000_000_000))
            }
            metrics["\(prefix)_delta_kib"] = Double(payload.count) / 1_024
            if let delta = decoded {
                metrics["\(prefix)_delta_apply_ms"] = medianMilliseconds(rounds: rounds) {
                    var copy = receiver
                    copy.apply(delta)
                    precondition(copy.context.replicas.count >= count)
                }
                metrics["\(prefix)_delta_merge_ms"] = medianMilliseconds(rounds: rounds) {
                    var context = receiver.context
                    context.merge(delta.context)
                }
                metrics["\(prefix)_delta_digest_ms"] = medianMilliseconds(rounds: rounds) { _ = delta.digest }
                metrics["\(prefix)_delta_includes_ms"] = medianMilliseconds(rounds: rounds) {
                    _ = receiver.context.includes(delta.context)
                    _ = delta.context.includes(receiver.context)
                }
                let dir = temporaryStoreDirectory()
                defer { try? FileManager.default.removeItem(atPath: dir) }
                let store = try ReplicaStore.create(directory: dir, name: "receiver")
                try store.applyRemote(receiver.delta(missingFrom: CausalContext()), from: "bench")
                metrics["\(prefix)_delta_store_ms"] = milliseconds(ContinuousClock().measure {
                    _ = try? store.applyRemote(delta, from: "bench")
                })
            }
            let hello = Message.hello(Hello(replicaID: ReplicaID.random(using: &rng), name: "wide", wallClockMilliseconds: 1_700_000_000_000,
                                            context: wideContext, digest: .empty)).encodedFrame()
            var splitter = FrameSplitter()
            splitter.append(hello)
            let frame = try splitter.next()!
            metrics["\(prefix)_hello_decode_ms"] = medianMilliseconds(rounds: rounds) {
                _ = try? Message.decode(type: frame.type, body: frame.body)
            }
        }

        // 3. Contexts over the limits, which must be refused before any large set is built.
        let hugeCloud = rawContextBlob(replicas: 1, contiguous: 1, cloudPerReplica: quick ? 50_000 : 1_000_000, gap: 2)
        metrics["huge_cloud_decode_ms"] = medianMilliseconds(rounds: rounds) { _ = try? CausalContext(blob: hugeCloud) }
        let manyReplicas = rawContextBlob(replicas: quick ? 5_000 : 100_000, contiguous: 7, cloudPerReplica: 0, gap: 1)
        metrics["many_replicas_decode_ms"] = medianMilliseconds(rounds: rounds) { _ = try? CausalContext(blob: manyReplicas) }

        // 4. Two clouds that interleave (odd counters against even ones): each merged dot
        //    closes a gap, the worst case for compaction.
        let half = quick ? 5_000 : 50_000
        let replica = ReplicaID.random(using: &rng)
        let odds = CausalContext(dots: (0..<half).map { Dot(replica: replica, counter: UInt64(2 * $0 + 3)) })
        let evens = CausalContext(dots: (0..<half).map { Dot(replica: replica, counter: UInt64(2 * $0 + 2)) })
        metrics["interleaved_merge_ms"] = medianMilliseconds(rounds: rounds) {
            var merged = odds
            merged.merge(evens)
            merged.insert(Dot(replica: replica, counter: 1))
            precondition(merged.contiguousCounter(of: replica) == UInt64(2 * half + 1))
        }

        // 5. A chunk frame near 4 MiB of small records, decoded as a node does.
        var big = RecordMap()
        var writer = ReplicaState(replicaID: ReplicaID.random(using: &rng), name: "big")
        var records = 0
        while true {
            big.apply(writer.write(shiftFields(records, &rng), to: RecordKey(collection: "shiftTypes", id: UUID())))
            records += 1
            if records % 1_000 == 0, WireDelta.encode(big, with: WireDictionary(startingAt: 0)).count > (quick ? 256 << 10 : 4_000_000) { break }
        }
        let chunkPayload = WireDelta.encode(records: big.allRecords, context: big.context, with: WireDictionary(startingAt: 0))
        let chunk = Message.chunk(index: 0, count: 1, records: UInt64(records), delta: chunkPayload).encodedFrame()
        metrics["max_chunk_kib"] = Double(chunk.count) / 1_024
        metrics["max_chunk_decode_ms"] = medianMilliseconds(rounds: rounds) {
            var splitter = FrameSplitter()
            splitter.append(chunk)
            guard let frame = try? splitter.next(), case .chunk(_, _, _, let body, _)? = try? Message.decode(type: frame.type, body: frame.body)
            else { preconditionFailure("chunk did not decode") }
            _ = try? WireDelta.decode(body, with: WireDictionary(startingAt: 0))
        }
        return Result(name: "hostile-input",
                      detail: "worst-case frames ≤ 4 MiB: deltas and hellos naming \(wide) and 10,000 replica IDs, over-limit contexts, "
                          + "interleaved clouds of \(2 * half) dots, a \(records)-record chunk",
                      metrics: metrics)
    }

    /// A context blob (docs/PROTOCOL.md §6.2) written byte by byte, so it can break the limits.
    static func rawContextBlob(replicas: Int, contiguous: UInt64, cloudPerReplica: Int, gap: UInt64) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(replicas * 20 + cloudPerReplica * replicas + 16)
        Varint.append(UInt64(replicas), to: &out)
        for i in 0..<replicas { ReplicaID(high: 0xB0B, low: UInt64(i)).appendBigEndianBytes(to: &out) }
        Varint.append(UInt64(replicas), to: &out)
        for i in 0..<replicas {
            Varint.append(UInt64(i), to: &out)
            Varint.append(contiguous, to: &out)
            Varint.append(UInt64(cloudPerReplica), to: &out)
            for _ in 0..<cloudPerReplica { Varint.append(gap, to: &out) }
        }
        return out
    }
}
