import Foundation

/// A task executor with a thread of its own. A test that blocks — waits for child processes,
/// polls with `usleep` — runs its body on one (`withTaskExecutorPreference`) so it never holds
/// a thread of the cooperative pool: on a 2-core machine the pool has two, and a long blocking
/// test starved every test running beside it ("the replicas did not connect" after minutes).
public final class ThreadExecutor: TaskExecutor, @unchecked Sendable {
    private let condition = NSCondition()
    private var jobs: [UnownedJob] = []
    private var stopping = false

    public init(name: String) {
        let thread = Thread { [self] in loop() }
        thread.name = name
        thread.start()
    }

    public func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        condition.lock()
        jobs.append(job)
        condition.signal()
        condition.unlock()
    }

    /// Ends the thread once the jobs enqueued so far have run.
    public func shutdown() {
        condition.lock()
        stopping = true
        condition.signal()
        condition.unlock()
    }

    private func loop() {
        while true {
            condition.lock()
            while jobs.isEmpty && !stopping { condition.wait() }
            if jobs.isEmpty && stopping {
                condition.unlock()
                return
            }
            let job = jobs.removeFirst()
            condition.unlock()
            job.runSynchronously(on: asUnownedTaskExecutor())
        }
    }
}

/// Runs `body` on a thread of its own instead of the cooperative pool (see ``ThreadExecutor``).
public func onOwnThread<T: Sendable>(_ name: String, _ body: @Sendable () async throws -> T) async throws -> T {
    let executor = ThreadExecutor(name: name)
    defer { executor.shutdown() }
    return try await withTaskExecutorPreference(executor) { try await body() }
}
