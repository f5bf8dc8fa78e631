import Synchronization

/// Fans values out to any number of `AsyncStream` subscribers (a node's events, a replica's
/// changes, status and health). Each stream keeps the newest `buffer` values its reader has
/// not taken yet.
package final class Broadcaster<T: Sendable>: Sendable {
    private let subscribers = Mutex<(next: Int, continuations: [Int: AsyncStream<T>.Continuation])>((0, [:]))
    private let buffer: Int

    package init(buffer: Int = 1_000) { self.buffer = buffer }

    /// A new subscriber; it ends when the consumer stops iterating or ``finish()`` is called.
    /// `lossless`: keeps everything its reader has not taken (for events a reader must act on;
    /// their rate must be bounded by their sender).
    package func subscribe(lossless: Bool = false) -> AsyncStream<T> {
        let (stream, continuation) = AsyncStream<T>.makeStream(bufferingPolicy: lossless ? .unbounded : .bufferingNewest(buffer))
        let id = subscribers.withLock { s in
            defer { s.next += 1 }
            s.continuations[s.next] = continuation
            return s.next
        }
        continuation.onTermination = { [weak self] _ in
            _ = self?.subscribers.withLock { $0.continuations.removeValue(forKey: id) }
        }
        return stream
    }

    package func yield(_ value: T) {
        for continuation in subscribers.withLock({ Array($0.continuations.values) }) { continuation.yield(value) }
    }

    /// Ends every subscriber's stream.
    package func finish() {
        for continuation in subscribers.withLock({ Array($0.continuations.values) }) { continuation.finish() }
    }
}
