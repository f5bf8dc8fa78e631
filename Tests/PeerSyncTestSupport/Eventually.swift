/// Polls `condition` until it holds or `timeout` passes; returns whether it held. Every wait in
/// the tests goes through this (bounded in time, never a bare sleep).
///
/// The default bound is generous on purpose: it only matters when a test fails, and the full
/// suite runs every test at once on CI's 2 cores, where a TLS handshake can wait seconds for a
/// thread (a 20 s bound failed there twice with nothing wrong but the load).
public func eventually(
    timeout: Duration = .seconds(60), every interval: Duration = .milliseconds(10),
    _ condition: () async throws -> Bool
) async rethrows -> Bool {
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        if try await condition() { return true }
        try? await Task.sleep(for: interval)
    }
    return try await condition()
}
