#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Dispatch
import Synchronization

/// What the caller's side and the discovery thread of one run share: a stop flag, a pipe that
/// wakes the thread's `poll()`, and the "exited" signal that callers await.
final class DiscoveryRun: Sendable {
    /// Runs whose thread has not exited yet, in every ``PeerDiscovery`` of the process.
    private static let live = Mutex<[ObjectIdentifier: DiscoveryRun]>([:])

    private let stopFlag = Atomic<Bool>(false)
    private let exitState = Mutex(ExitState())
    /// Signalled once at exit, for other discovery threads (never awaited on the cooperative pool).
    private let exitedSignal = DispatchSemaphore(value: 0)
    /// Read end of the wake-up pipe (-1 if the pipe could not be made; the thread then notices a
    /// stop within its longest poll timeout).
    let wakeReadFD: Int32
    private let wakeWriteFD: Int32

    init() {
        var fds: [Int32] = [-1, -1]
        if pipe(&fds) == 0 {
            for fd in fds {
                _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
                _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            }
        } else {
            fds = [-1, -1]
        }
        wakeReadFD = fds[0]
        wakeWriteFD = fds[1]
        Self.live.withLock { $0[ObjectIdentifier(self)] = self }
    }

    deinit {
        if wakeReadFD >= 0 { close(wakeReadFD) }
        if wakeWriteFD >= 0 { close(wakeWriteFD) }
    }

    var stopRequested: Bool { stopFlag.load(ordering: .acquiring) }
    var hasExited: Bool { exitState.withLock { $0.hasExited } }

    /// Asks the thread to stop; returns at once.
    func requestStop() {
        guard !stopFlag.exchange(true, ordering: .acquiringAndReleasing) else { return }
        guard wakeWriteFD >= 0 else { return }
        var byte: UInt8 = 1
        _ = write(wakeWriteFD, &byte, 1)
    }

    /// Empties the wake-up pipe (called by the discovery thread).
    func drainWakeups() {
        guard wakeReadFD >= 0 else { return }
        var buffer = [UInt8](repeating: 0, count: 64)
        while read(wakeReadFD, &buffer, buffer.count) > 0 {}
    }

    /// Called once by the discovery thread as its last action: resumes every waiter.
    func markExited() {
        let waiting = exitState.withLock { $0.exited() }
        Self.live.withLock { $0[ObjectIdentifier(self)] = nil }
        exitedSignal.signal()
        for continuation in waiting { continuation.resume(returning: true) }
    }

    // MARK: - Waiting for the exit

    /// Suspends (never blocks a thread) until the run's thread has exited, at most `timeout`.
    /// Returns true if it exited; false on timeout or if the calling task is cancelled.
    func waitForExit(timeout: Duration) async -> Bool {
        guard let waiter = exitState.withLock({ $0.addWaiter() }) else { return true }
        let timer = Task { [self] in
            if (try? await Task.sleep(for: timeout)) != nil { settle(waiter, exited: false) }
        }
        defer { timer.cancel() }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                if let result = exitState.withLock({ $0.suspend(waiter, continuation) }) {
                    continuation.resume(returning: result)
                }
            }
        } onCancel: {
            settle(waiter, exited: false)
        }
    }

    private func settle(_ waiter: Int, exited: Bool) {
        exitState.withLock { $0.settle(waiter, exited: exited) }?.resume(returning: exited)
    }

    /// Runs of any ``PeerDiscovery`` that were asked to stop and have not exited yet.
    static func stopping(except run: DiscoveryRun) -> [DiscoveryRun] {
        live.withLock { Array($0.values) }.filter { $0 !== run && $0.stopRequested }
    }

    /// Blocks the calling thread until every run in `runs` has exited, or until `timeout` has
    /// passed in all. Only for a discovery thread: never call it from async code.
    static func blockUntilExited(_ runs: [DiscoveryRun], timeout: Duration) {
        let deadline = ContinuousClock.now + timeout
        for run in runs where !run.hasExited {
            let (seconds, attoseconds) = max(deadline - .now, .zero).components
            let nanoseconds = Int(seconds) * 1_000_000_000 + Int(attoseconds / 1_000_000_000)
            guard run.exitedSignal.wait(timeout: .now() + .nanoseconds(nanoseconds)) == .success else { return }
            run.exitedSignal.signal()  // let any other waiter through too
        }
    }
}

/// The exit flag and the tasks awaiting it. A waiter is registered before it suspends, so that a
/// timeout, a cancellation or the exit arriving first is kept and returned when it does.
private struct ExitState {
    enum Waiter {
        case registered
        case suspended(CheckedContinuation<Bool, Never>)
        case settled(Bool)
    }

    var hasExited = false
    var waiters: [Int: Waiter] = [:]
    var nextWaiter = 0

    /// A new waiter's number; nil if the thread has already exited.
    mutating func addWaiter() -> Int? {
        guard !hasExited else { return nil }
        nextWaiter += 1
        waiters[nextWaiter] = .registered
        return nextWaiter
    }

    /// Parks `continuation`; returns the result instead if the waiter is already settled.
    mutating func suspend(_ waiter: Int, _ continuation: CheckedContinuation<Bool, Never>) -> Bool? {
        if case .settled(let exited) = waiters[waiter] {
            waiters[waiter] = nil
            return exited
        }
        waiters[waiter] = .suspended(continuation)
        return nil
    }

    /// Settles `waiter`; returns its continuation to resume if it is suspended.
    mutating func settle(_ waiter: Int, exited: Bool) -> CheckedContinuation<Bool, Never>? {
        switch waiters[waiter] {
        case .registered:
            waiters[waiter] = .settled(exited)
            return nil
        case .suspended(let continuation):
            waiters[waiter] = nil
            return continuation
        case .settled, nil:
            return nil
        }
    }

    /// Marks the exit; returns the continuations to resume (with true).
    mutating func exited() -> [CheckedContinuation<Bool, Never>] {
        hasExited = true
        var suspended: [CheckedContinuation<Bool, Never>] = []
        for (waiter, state) in waiters {
            switch state {
            case .registered: waiters[waiter] = .settled(true)
            case .suspended(let continuation): suspended.append(continuation); waiters[waiter] = nil
            case .settled: break
            }
        }
        return suspended
    }
}
