@_spi(Engine) @testable import PeerSyncCRDT
import PeerSyncTestSupport
import Testing

@Suite("Stable hasher")
struct StableHasherTests {
    /// The same bytes fed one at a time: the stream every other way of feeding must equal.
    static func bytewise(_ prefix: [UInt8], _ bytes: [UInt8]) -> (UInt64, UInt64) {
        var h = StableHasher()
        for byte in prefix { h.combine(byte) }
        withUnsafeBytes(of: UInt64(bytes.count).littleEndian) { for byte in $0 { h.combine(byte) } }
        for byte in bytes { h.combine(byte) }
        return h.finalize()
    }

    @Test("length-prefixed bytes, whole words and the tail word, hash as the same bytes fed one at a time (every length 0–40 after 0–7 pending bytes)")
    func wordsEqualBytes() {
        var rng = SeededGenerator(seed: baseSeed)
        for pending in 0..<8 {
            for length in 0...40 {
                let prefix = (0..<pending).map { _ in UInt8.random(in: 0...255, using: &rng) }
                let bytes = (0..<length).map { _ in UInt8.random(in: 0...255, using: &rng) }
                var h = StableHasher()
                for byte in prefix { h.combine(byte) }
                bytes.withUnsafeBufferPointer { h.combine(lengthPrefixed: $0) }
                let fast = h.finalize()
                let slow = Self.bytewise(prefix, bytes)
                #expect(fast == slow, "pending \(pending), length \(length)")
                // And through a String (UTF-8 bytes, length-prefixed).
                if let text = String(validating: bytes, as: UTF8.self) {
                    var s = StableHasher()
                    for byte in prefix { s.combine(byte) }
                    s.combine(text)
                    #expect(s.finalize() == slow)
                }
            }
        }
    }
}
