import Foundation

/// Two waits of ``Replicator/shutdown()``, each bounded: until the commit in flight (and any it
/// starts) is stored, and until the commit queue has drained.
extension Replicator {
    func waitForCommits(timeout: Duration) async {
        guard core.inFlight != nil else { return }
        let deadline = Task { [weak self] in
            try? await Task.sleep(for: timeout)
            await self?.releaseCommitWaiters()
        }
        await withCheckedContinuation { idleCommitWaiters.append($0) }
        deadline.cancel()
    }

    func releaseCommitWaiters() {
        for waiter in idleCommitWaiters { waiter.resume() }
        idleCommitWaiters = []
    }

    /// Returns once everything queued on the commit queue so far (a gossip write) has run.
    func drainCommitQueue() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            commitQueue.async { continuation.resume() }
        }
    }
}
