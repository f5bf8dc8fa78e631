import PeerSyncCRDT
import PeerSyncWire
import Synchronization

/// What a session has to send, in order.
enum OutboxItem: Sendable {
    case message(Message)
    /// A catch-up: split into chunks by the writer as it sends them.
    case catchUp(RecordMap)
    case delta(RecordMap)
}

/// The bounded queue between a node and one session's writer.
///
/// Pushing never blocks the node. Queued deltas are joined into one frame when the writer
/// falls behind (coalescing under load). If a slow or stuck peer lets more than
/// ``limitBytes`` of deltas pile up, they are dropped and the writer later sends one
/// anti-entropy extract instead (computed from what the peer is known to have), so memory
/// stays bounded and no change is lost.
final class Outbox: Sendable {
    static let limitBytes = 8 << 20

    private struct State {
        var items: [OutboxItem] = []
        var pendingBytes = 0
        var needsResync = false
        var finished = false
        var waiter: CheckedContinuation<Void, Never>?
    }

    private let state = Mutex(State())

    /// Queues `item`. Returns false if deltas are being dropped until the next resync.
    @discardableResult
    func push(_ item: OutboxItem) -> Bool {
        let waiter: CheckedContinuation<Void, Never>? = state.withLock { s in
            guard !s.finished else { return nil }
            if case .delta(let delta) = item {
                if s.needsResync { return nil }
                let size = delta.approximateWireBytes
                if s.pendingBytes + size > Self.limitBytes {
                    s.items.removeAll { if case .delta = $0 { true } else { false } }
                    s.pendingBytes = 0
                    s.needsResync = true
                } else {
                    s.items.append(item)
                    s.pendingBytes += size
                }
            } else {
                s.items.append(item)
            }
            defer { s.waiter = nil }
            return s.waiter
        }
        waiter?.resume()
        return !state.withLock { $0.needsResync }
    }

    /// Stops accepting items; the writer sends what is queued, then ends.
    func finish() {
        let waiter = state.withLock { s in
            s.finished = true
            defer { s.waiter = nil }
            return s.waiter
        }
        waiter?.resume()
    }

    /// Everything queued (nil once finished and empty), and whether a resync is due.
    func next() async -> (items: [OutboxItem], resync: Bool)? {
        while true {
            let batch: (items: [OutboxItem], resync: Bool)?? = state.withLock { s in
                if !s.items.isEmpty || s.needsResync {
                    defer {
                        s.items = []
                        s.pendingBytes = 0
                        s.needsResync = false
                    }
                    return (s.items, s.needsResync)
                }
                if s.finished { return .some(nil) }
                return nil
            }
            if let batch { return batch }
            await withCheckedContinuation { continuation in
                let ready = state.withLock { s in
                    if !s.items.isEmpty || s.needsResync || s.finished { return true }
                    s.waiter = continuation
                    return false
                }
                if ready { continuation.resume() }
            }
        }
    }
}

extension RecordMap {
    /// A cheap upper estimate of this delta's encoded size, for queue accounting.
    var approximateWireBytes: Int {
        var total = 16 + context.replicas.count * 24
        for (_, records) in collections {
            for (_, state) in records {
                total += 24 + state.presence.count * 12
                for register in state.fields.values { total += 20 + register.value.approximateBytes }
            }
        }
        return total
    }

    /// Index ranges of `records` that make chunks of about `targetBytes` (at least one range,
    /// possibly empty). Only the last chunk carries the context, so a catch-up cut short never
    /// claims dots whose data did not arrive.
    func chunkBounds(_ records: [(RecordKey, RecordState)], targetBytes: Int) -> [Range<Int>] {
        var bounds: [Range<Int>] = []
        var start = 0
        var size = 0
        for (index, (_, state)) in records.enumerated() {
            let recordBytes = 24 + state.presence.count * 12 + state.fields.values.reduce(0) { $0 + 8 + $1.value.approximateBytes }
            if size + recordBytes > targetBytes && index > start {
                bounds.append(start..<index)
                start = index
                size = 0
            }
            size += recordBytes
        }
        bounds.append(start..<records.count)
        return bounds
    }
}

extension FieldValue {
    var approximateBytes: Int {
        switch self {
        case .null, .bool: 1
        case .int: 6
        case .double: 9
        case .string(let s): 2 + s.utf8.count
        case .bytes(let b): 2 + b.count
        case .list(let l): 2 + l.reduce(0) { $0 + $1.approximateBytes }
        case .map(let m): 2 + m.reduce(0) { $0 + 2 + $1.key.utf8.count + $1.value.approximateBytes }
        case .uuid: 17
        }
    }
}
