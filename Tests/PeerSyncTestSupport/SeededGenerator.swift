@_spi(Engine) import PeerSyncCRDT

/// SplitMix64: a small, fast, seedable generator so every random test case can be replayed
/// from the seed it prints.
public struct SeededGenerator: RandomNumberGenerator, Sendable {
    private var state: UInt64

    public init(seed: UInt64) { state = seed }

    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// True with probability `p`.
    public mutating func chance(_ p: Double) -> Bool {
        Double.random(in: 0..<1, using: &self) < p
    }
}

/// The base seed of randomized tests: `PEERSYNC_SEED` from the environment, or a fixed default
/// so CI runs are reproducible. Case `i` of a test uses `baseSeed &+ i`.
public let baseSeed: UInt64 = {
    if let text = ProcessInfo.processInfo.environment["PEERSYNC_SEED"], let seed = UInt64(text) { return seed }
    return 20_261_121
}()


