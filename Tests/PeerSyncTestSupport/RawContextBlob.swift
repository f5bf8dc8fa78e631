@_spi(Engine) import PeerSyncCRDT

/// A context blob (docs/PROTOCOL.md §6.2) written byte by byte, so it can break every limit.
public func rawContextBlob(replicas: Int, contiguous: UInt64, cloudPerReplica: Int, gap: UInt64 = 2) -> [UInt8] {
    var out: [UInt8] = []
    out.reserveCapacity(replicas * 20 + replicas * cloudPerReplica + 16)
    Varint.append(UInt64(replicas), to: &out)
    for i in 0..<replicas { ReplicaID(high: 0xB0B, low: UInt64(i)).appendBigEndianBytes(to: &out) }
    Varint.append(UInt64(replicas), to: &out)
    for i in 0..<replicas {
        Varint.append(UInt64(i), to: &out)
        Varint.append(contiguous, to: &out)
        Varint.append(UInt64(cloudPerReplica), to: &out)
        for _ in 0..<cloudPerReplica { Varint.append(gap, to: &out) }
    }
    return out
}
