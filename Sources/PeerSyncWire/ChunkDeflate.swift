import CZlib

/// Raw DEFLATE (RFC 1951) of catch-up chunk deltas (docs/PROTOCOL.md §5.2, hello feature
/// ``HelloFeatures/deflatedChunks``).
///
/// A catch-up round is bulk data: records whose field names, kinds and much of their text
/// repeat from record to record. Live deltas (one change, tens of bytes) are never compressed.
package enum ChunkDeflate {
    /// Deltas shorter than this are sent as they are: the stream's own overhead and the
    /// call's fixed cost buy nothing there.
    package static let minimumBytes = 512
    /// The largest delta a deflated chunk may declare (4 MiB, the default frame limit): the
    /// receiver allocates the declared length, so it is bounded like a frame is.
    package static let maxInflatedBytes = WireLimits.defaultMaxFrameBytes
    /// zlib's fastest level: a catch-up is on the critical path of a first sync, and level 1
    /// already takes sync-initial's 100k records from 114 to 49 bytes each at no cost in time
    /// (docs/BENCHMARKS.md, "Issue 15, fourth pass").
    static let level: Int32 = 1

    /// `delta` compressed, or nil when it is outside the bounds or compressing saves less than
    /// the chunk field that declares the inflated length costs.
    package static func deflate(_ delta: [UInt8]) -> [UInt8]? {
        guard delta.count >= minimumBytes, delta.count <= maxInflatedBytes else { return nil }
        // No longer than the input less the length field: a larger result is not sent.
        return deflateRaw(delta, capacity: delta.count - 6)
    }

    /// One raw DEFLATE stream of `bytes`, or nil if it takes more than `capacity` bytes.
    static func deflateRaw(_ bytes: [UInt8], capacity: Int) -> [UInt8]? {
        let packed = [UInt8](unsafeUninitializedCapacity: capacity) { out, count in
            count = bytes.withUnsafeBufferPointer { input in
                peersync_deflate_raw(input.baseAddress, input.count, out.baseAddress, capacity, level)
            }
        }
        return packed.isEmpty ? nil : packed
    }

    /// The delta a deflated chunk carries: `packed` inflated to exactly `length` bytes.
    package static func inflate(_ packed: [UInt8], to length: UInt64) throws(WireError) -> [UInt8] {
        guard length >= 1, length <= UInt64(maxInflatedBytes) else {
            throw .malformed(message: "chunk", detail: "inflated length \(length) is outside 1…\(maxInflatedBytes)")
        }
        let expected = Int(length)
        var code: Int32 = 0
        let delta = [UInt8](unsafeUninitializedCapacity: expected) { out, count in
            code = packed.withUnsafeBufferPointer { input in
                peersync_inflate_raw(input.baseAddress, input.count, out.baseAddress, expected)
            }
            count = code == 0 ? expected : 0
        }
        switch code {
        case 0: return delta
        case 2: throw .malformed(message: "chunk", detail: "the deflated delta inflates to more than its declared \(length) bytes")
        case 3: throw .malformed(message: "chunk", detail: "the deflated delta inflates to fewer than its declared \(length) bytes")
        case 4: throw .malformed(message: "chunk", detail: "bytes after the end of the deflated delta")
        default: throw .malformed(message: "chunk", detail: "the deflated delta is not a valid raw DEFLATE stream")
        }
    }
}
