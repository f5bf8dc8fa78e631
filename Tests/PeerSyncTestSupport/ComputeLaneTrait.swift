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
