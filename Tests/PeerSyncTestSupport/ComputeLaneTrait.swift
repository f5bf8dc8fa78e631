import Testing

/// Runs each test of a suite (or one test) on the compute lane: one thread shared by every test
/// with this trait, off the cooperative pool, so they run one after another and take at most
/// one core. For tests that compute for seconds without awaiting — law checkers, randomized
/// histories, fuzzing — in a debug build. Swift Testing runs every test at once; on a 2-core
/// machine the pool has two threads, and two such tests held both for minutes while every
/// session test beside them timed out (CI, issue 30: the law tests and the dot-index walk on
/// both pool threads while joiners' handshakes passed 10 s). A thread of their own each was not
/// enough: forty of them at once left the sessions a fortieth of the machine.
public struct ComputeLaneTrait: TestTrait, SuiteTrait, TestScoping {
    public var isRecursive: Bool { true }

    public func provideScope(for test: Test, testCase: Test.Case?,
                             performing function: @Sendable () async throws -> Void) async throws {
        guard testCase != nil else { return try await function() }  // the suite itself
        try await withTaskExecutorPreference(Self.lane) { try await function() }
    }

    private static let lane = ThreadExecutor(name: "compute lane")
}

extension Trait where Self == ComputeLaneTrait {
    /// Each test on the compute lane, one at a time, off the cooperative pool (``ComputeLaneTrait``).
    public static var computeLane: Self { ComputeLaneTrait() }
}

/// Runs each test of a suite (or one test) on a thread of its own (``onOwnThread(_:_:)``), off
/// the cooperative pool. For tests that block while they wait — for child processes (`poll`,
/// `waitUntilExit`, `usleep` loops), on semaphores of store hooks: each would hold one of the
/// pool's two threads on a 2-core machine for as long as it waits, and every async test stalls
/// behind it (CI, issue 30: pipe sessions whose handshakes, all hops through the pool, took
/// minutes while lab and CLI tests polled their children).
public struct OwnThreadTrait: TestTrait, SuiteTrait, TestScoping {
    public var isRecursive: Bool { true }

    public func provideScope(for test: Test, testCase: Test.Case?,
                             performing function: @Sendable () async throws -> Void) async throws {
        guard testCase != nil else { return try await function() }  // the suite itself
        await Self.slots.acquire()
        do {
            try await onOwnThread(test.name) { try await function() }
        } catch {
            await Self.slots.release()
            throw error
        }
        await Self.slots.release()
    }

    /// At most two such tests at once: they start child processes and network labs, and all of
    /// them at once (when they no longer wait for a pool thread) loaded 2 cores to 22 and made
    /// timing-sensitive tests fail in their turn. Waiting for a slot suspends; it holds no thread,
    /// but it counts toward a test's time limit (the lab tests' limits are 10 minutes for that).
    private static let slots = Slots(2)
}

/// A counting semaphore for tasks: ``acquire()`` suspends until a slot is free.
actor Slots {
    private var free: Int
    private var waiters: [CheckedContinuation<Void, Never>] = []

    init(_ count: Int) { free = count }

    func acquire() async {
        if free > 0 {
            free -= 1
            return
        }
        await withCheckedContinuation { waiters.append($0) }
    }

    func release() {
        if waiters.isEmpty { free += 1 } else { waiters.removeFirst().resume() }
    }
}

extension Trait where Self == OwnThreadTrait {
    /// Each test on a thread of its own, off the cooperative pool (``OwnThreadTrait``).
    public static var ownThread: Self { OwnThreadTrait() }
}
