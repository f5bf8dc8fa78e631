import Synchronization

/// Wakes a session's writer when there is output. A signal sent while nobody waits is kept
/// (the next wait returns at once), so no wake-up is lost between "nothing to send" and "wait".
package final class OutputSignal: Sendable {
    private let state = Mutex<(pending: Bool, finished: Bool, waiter: CheckedContinuation<Bool, Never>?)>((false, false, nil))

    package func signal() {
        let waiter = state.withLock { s -> CheckedContinuation<Bool, Never>? in
            guard let waiter = s.waiter else {
                s.pending = true
                return nil
            }
            s.waiter = nil
            return waiter
        }
        waiter?.resume(returning: true)
    }

    package func finish() {
        let waiter = state.withLock { s -> CheckedContinuation<Bool, Never>? in
            s.finished = true
            defer { s.waiter = nil }
            return s.waiter
        }
        waiter?.resume(returning: false)
    }

    /// Waits for a signal; false once finished (the session is gone).
    package func wait() async -> Bool {
        await withCheckedContinuation { continuation in
            let immediate: Bool? = state.withLock { s in
                if s.pending {
                    s.pending = false
                    return true
                }
                if s.finished { return false }
                s.waiter = continuation
                return nil
            }
            if let immediate { continuation.resume(returning: immediate) }
        }
    }
}
