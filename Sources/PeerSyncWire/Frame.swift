@_spi(Engine) import PeerSyncCRDT

/// Frames: a varint length, then that many bytes — a one-byte message type and the body.
///
/// ```
/// +------------------+-----------+------------------------------+
/// | length: varint   | type: u8  | body: (length - 1) bytes     |
/// | (1–5 bytes)      |           |                              |
/// +------------------+-----------+------------------------------+
/// ```
///
/// `length` counts the type byte and the body, is at least 1 and at most the receiver's
/// maximum frame size (announced in its hello; ``WireLimits/defaultMaxFrameBytes`` by default).
/// A length over the limit is refused as soon as its varint is read, before any body arrives.
package enum Frame {
    /// Result of looking at the start of a buffer.
    package enum Header: Equatable {
        /// Not enough bytes yet to know the length.
        case needMore
        /// A frame whose type byte starts at `headerBytes` and which ends at
        /// `headerBytes + length` (it may not all be there yet).
        case frame(length: Int, headerBytes: Int)
    }

    /// Reads the length prefix at the start of `bytes`.
    package static func header<C: Collection<UInt8>>(_ bytes: C, maxFrameBytes: Int) throws(WireError) -> Header {
        var value: UInt64 = 0
        var shift: UInt64 = 0
        var count = 0
        for byte in bytes {
            count += 1
            value |= UInt64(byte & 0x7f) << shift
            if byte & 0x80 == 0 {
                guard value >= 1 else { throw .emptyFrame }
                guard value <= UInt64(maxFrameBytes) else { throw .frameTooLarge(length: value, limit: maxFrameBytes) }
                return .frame(length: Int(value), headerBytes: count)
            }
            shift += 7
            guard count < 5 else { throw .malformedLength }
            if value > UInt64(maxFrameBytes) { throw .frameTooLarge(length: value, limit: maxFrameBytes) }
        }
        return .needMore
    }

    /// The bytes of one frame.
    /// The message type of one encoded frame (the byte after its length), nil if malformed.
    package static func messageType(of frame: [UInt8]) -> UInt8? {
        var offset = 0
        while offset < min(frame.count, 10), frame[offset] & 0x80 != 0 { offset += 1 }
        return offset + 1 < frame.count ? frame[offset + 1] : nil
    }

    package static func encode(type: UInt8, body: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(body.count + 6)
        Varint.append(UInt64(body.count + 1), to: &out)
        out.append(type)
        out.append(contentsOf: body)
        return out
    }
}

/// Splits a byte stream into frames (pure; the NIO handler and the fuzz target use it).
package struct FrameSplitter {
    package let maxFrameBytes: Int
    private var buffer: [UInt8] = []
    private var start = 0

    package init(maxFrameBytes: Int = WireLimits.defaultMaxFrameBytes) {
        self.maxFrameBytes = maxFrameBytes
    }

    package mutating func append<C: Collection<UInt8>>(_ bytes: C) {
        if start > 65_536 && start * 2 > buffer.count {
            buffer.removeFirst(start)
            start = 0
        }
        buffer.append(contentsOf: bytes)
    }

    /// The next complete frame as (type, body), nil if more bytes are needed.
    package mutating func next() throws(WireError) -> (type: UInt8, body: [UInt8])? {
        let available = buffer[start...]
        switch try Frame.header(available, maxFrameBytes: maxFrameBytes) {
        case .needMore: return nil
        case .frame(let length, let headerBytes):
            guard available.count >= headerBytes + length else { return nil }
            let typeIndex = start + headerBytes
            let body = Array(buffer[(typeIndex + 1)..<(typeIndex + length)])
            let type = buffer[typeIndex]
            start = typeIndex + length
            return (type, body)
        }
    }
}

/// Bounds every implementation must apply.
package enum WireLimits {
    /// Largest frame a node accepts unless it announces otherwise: 4 MiB.
    package static let defaultMaxFrameBytes = 4 << 20
    /// Smallest frame limit a node may announce.
    package static let minimumMaxFrameBytes = 64 << 10
    /// Catch-up chunks stay below this many encoded bytes (well under the frame limit).
    package static let chunkTargetBytes = 256 << 10
    /// Protocol version spoken by this build. Peers with another version are refused.
    package static let protocolVersion: UInt64 = 2
    /// Most chunks one catch-up round may announce (a chunk's `count`): 2³², a round of at
    /// least 4 GiB. A larger count is malformed, so a receiver can count chunks in any integer.
    package static let maxChunksPerRound: UInt64 = 1 << 32
}
