import Synchronization
import Testing

/// Cleanup a test starts as it ends (`defer` cannot await: a node's `stop()` is async). The
/// suite's ``AwaitsCleanups`` trait awaits every one of them before the suite ends, so nodes are
/// stopped and store folders removed even after the last test of a run (a detached `Task` alone
/// was still running when the process exited, and left its folders in /tmp).
func afterTest(_ work: @escaping @Sendable () async -> Void) {
    AwaitsCleanups.pending.withLock { $0.append(Task { await work() }) }
}

struct AwaitsCleanups: SuiteTrait, TestScoping {
    static let pending = Mutex<[Task<Void, Never>]>([])

    func provideScope(for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void) async throws {
        do {
            try await function()
        } catch {
            await Self.drain()
            throw error
        }
        await Self.drain()
    }

    /// Awaits every cleanup started so far, and any they start meanwhile.
    static func drain() async {
        while true {
            let tasks = pending.withLock { tasks in defer { tasks = [] }; return tasks }
            if tasks.isEmpty { return }
            for task in tasks { await task.value }
        }
    }
}

extension Trait where Self == AwaitsCleanups {
    /// Awaits the suite's ``afterTest(_:)`` cleanups when the suite ends.
    static var awaitsCleanups: Self { Self() }
}
