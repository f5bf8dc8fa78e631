@_spi(Engine) import PeerSyncCRDT

/// Per-session, per-direction interning of replica IDs and names, plus the last timestamp
/// sent, so a delta names a 16-byte replica ID or a field name once per session and refers to
/// it by a small index afterwards.
///
/// The sender's and the receiver's dictionaries evolve identically because frames arrive in
/// order on one connection; a session that fails to decode any frame is closed, so the two
/// never disagree for long. A reference is written as:
///
/// ```
/// ref = varint(0) definition   — a new entry; it gets the next index (0, 1, 2, …)
///     | varint(index + 1)      — an entry defined earlier in this direction of this session
/// ```
/// A replica ID definition is 16 bytes (high 8 big-endian, low 8 big-endian); a name definition
/// is varint(byte count) UTF-8.
package final class WireDictionary {
    /// Most entries of each kind one direction of a session may define.
    package static let capacity = 1 << 16

    private var replicas: [ReplicaID] = []
    private var replicaIndex: [ReplicaID: Int] = [:]
    private var names: [String] = []
    private var nameIndex: [String: Int] = [:]
    /// Physical milliseconds of the last timestamp written or read; timestamps are sent as a
    /// signed difference from it. Both sides start at the sender's hello wall clock.
    var lastPhysical: UInt64
    /// By replica index: the counter of the replica's last event-form delta in this direction
    /// (none: 0); form 02 sends an event's counter as the distance from it.
    var lastEventCounters: [UInt64] = []
    /// Encoding: the peer reads event counters relative to the last (its hello announced
    /// ``HelloFeatures/eventCounters``). Decoding takes both forms whatever this says.
    package var relativeEventCounters = false

    package init(startingAt wallClockMilliseconds: UInt64) {
        lastPhysical = wallClockMilliseconds
    }

    /// Writes a reference to `id` (defining it if new) and returns its index.
    @discardableResult
    func writeReplica(_ id: ReplicaID, to out: inout [UInt8]) -> Int {
        if let index = replicaIndex[id] {
            Varint.append(UInt64(index + 1), to: &out)
            return index
        }
        out.append(0)
        id.appendBigEndianBytes(to: &out)
        return define(id)
    }

    func readReplica(from reader: inout ByteReader) throws(WireError) -> ReplicaID {
        replicas[try readReplicaIndex(from: &reader)]
    }

    /// Reads a replica reference (defining the replica if new) and returns its index.
    func readReplicaIndex(from reader: inout ByteReader) throws(WireError) -> Int {
        guard let ref = reader.readVarint() else { throw .malformed(message: "delta", detail: "truncated replica reference") }
        if ref > 0 {
            guard ref <= UInt64(replicas.count) else {
                throw .malformed(message: "delta", detail: "replica reference \(ref) of \(replicas.count)")
            }
            return Int(ref - 1)
        }
        guard replicas.count < Self.capacity else { throw .dictionaryFull }
        guard let raw = reader.readBytes(16), let id = ReplicaID(bigEndianBytes: raw) else {
            throw .malformed(message: "delta", detail: "truncated replica ID")
        }
        guard replicaIndex[id] == nil else { throw .malformed(message: "delta", detail: "replica ID defined twice") }
        return define(id)
    }

    func replica(at index: Int) -> ReplicaID { replicas[index] }

    private func define(_ id: ReplicaID) -> Int {
        let index = replicas.count
        replicaIndex[id] = index
        replicas.append(id)
        lastEventCounters.append(0)
        return index
    }

    func writeName(_ name: String, to out: inout [UInt8]) {
        if let index = nameIndex[name] {
            Varint.append(UInt64(index + 1), to: &out)
            return
        }
        out.append(0)
        Varint.append(UInt64(name.utf8.count), to: &out)
        out.append(contentsOf: name.utf8)
        nameIndex[name] = names.count
        names.append(name)
    }

    func readName(from reader: inout ByteReader) throws(WireError) -> String {
        guard let ref = reader.readVarint() else { throw .malformed(message: "delta", detail: "truncated name reference") }
        if ref > 0 {
            guard ref <= UInt64(names.count) else { throw .malformed(message: "delta", detail: "name reference \(ref) of \(names.count)") }
            return names[Int(ref - 1)]
        }
        guard names.count < Self.capacity else { throw .dictionaryFull }
        guard let bytes = reader.readLengthPrefixed(), let name = String(validating: bytes, as: UTF8.self) else {
            throw .malformed(message: "delta", detail: "bad name definition")
        }
        guard nameIndex[name] == nil else { throw .malformed(message: "delta", detail: "name defined twice") }
        nameIndex[name] = names.count
        names.append(name)
        return name
    }

    /// Whether `id` is already defined in this direction (a reference then costs ≤ 3 bytes).
    package func knows(_ id: ReplicaID) -> Bool { replicaIndex[id] != nil }

    /// Whether `name` is already defined in this direction.
    package func knows(name: String) -> Bool { nameIndex[name] != nil }

    /// `zigzag(physical − last physical)`, then `varint(logical)`.
    func writeTimestamp(_ t: HLCTimestamp, to out: inout [UInt8]) {
        let difference = Int64(bitPattern: t.physicalMilliseconds &- lastPhysical)
        Varint.append(UInt64(bitPattern: (difference << 1) ^ (difference >> 63)), to: &out)
        Varint.append(UInt64(t.logical), to: &out)
        lastPhysical = t.physicalMilliseconds
    }

    func readTimestamp(from reader: inout ByteReader) throws(WireError) -> HLCTimestamp {
        guard let zigzag = reader.readVarint(), let logical = reader.readVarint(), logical <= UInt64(UInt16.max) else {
            throw .malformed(message: "delta", detail: "bad timestamp")
        }
        let difference = Int64(bitPattern: (zigzag >> 1) ^ (0 &- (zigzag & 1)))
        let physical = lastPhysical &+ UInt64(bitPattern: difference)
        guard physical <= ValidationLimits.maxPhysicalMilliseconds else {
            throw .malformed(message: "delta", detail: "timestamp after the year 9999")
        }
        lastPhysical = physical
        return HLCTimestamp(physicalMilliseconds: physical, logical: UInt16(logical))
    }
}
