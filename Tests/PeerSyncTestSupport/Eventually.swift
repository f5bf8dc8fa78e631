/// Polls `condition` until it holds or `timeout` passes; returns whether it held. Every wait in
/// the tests goes through this (bounded in time, never a bare sleep).
public func eventually(
    timeout: Duration = .seconds(20), every interval: Duration = .milliseconds(10),
    _ condition: () async throws -> Bool
) async rethrows -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if try await condition() { return true }
        try? await Task.sleep(for: interval)
    }
    return try await condition()
}
