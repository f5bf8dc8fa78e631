import PeerSyncCRDT

/// The session encoding of a ``RecordMap`` (a delta, a catch-up chunk, or a whole state).
/// Replica IDs, collection and field names go through the session's ``WireDictionary``.
///
/// ```
/// delta       = 00 general | 01 event
///
/// general     = context varint(#collections) (name-ref varint(#records) record…)…
/// context     = varint(#replicas) (replica-ref varint(contiguous) varint(#cloud) varint(gap)…)…
///               (cloud counters ascending; each gap is the distance from the previous counter,
///                the first from `contiguous`; gaps are ≥ 1)
/// record      = 16-byte UUID varint(#fields) field… varint(#presence) presence…
/// field       = name-ref value timestamp replica-ref(writer) varint(counter) supersedes
/// presence    = replica-ref varint(counter) 00
///             | replica-ref varint(counter) 01 replica-ref(remover) varint(remover counter)
///
/// event       = replica-ref varint(counter) name-ref(collection) 16-byte UUID
///               varint(#fields) (name-ref value timestamp supersedes)…
///   — one local write: its context is exactly the dot (replica, counter), every field was
///     written by that dot, and the record's presence entry for the replica is (counter, live).
///
/// timestamp   = zigzag-varint(physical ms − previous physical ms in this direction) varint(logical)
/// supersedes  = 00 (none) | varint(1 + physical ms difference to the field's timestamp) varint(logical)
/// value       = FieldValue canonical encoding (docs/PROTOCOL.md)
/// ```
public enum WireDelta {
    public static func encode(_ delta: RecordMap, with dictionary: WireDictionary) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(64)
        if let event = singleEvent(delta) {
            out.append(1)
            dictionary.writeReplica(event.dot.replica, to: &out)
            Varint.append(event.dot.counter, to: &out)
            dictionary.writeName(event.key.collection, to: &out)
            appendUUID(event.key.id, to: &out)
            Varint.append(UInt64(event.state.fields.count), to: &out)
            for (name, register) in event.state.fields.sorted(by: { $0.key < $1.key }) {
                dictionary.writeName(name, to: &out)
                register.value.encode(into: &out)
                dictionary.writeTimestamp(register.timestamp, to: &out)
                writeSupersedes(register, to: &out)
            }
            return out
        }
        out.append(0)
        writeContext(delta.context, with: dictionary, to: &out)
        Varint.append(UInt64(delta.collections.count), to: &out)
        for (collection, records) in delta.collections.sorted(by: { $0.key < $1.key }) {
            dictionary.writeName(collection, to: &out)
            Varint.append(UInt64(records.count), to: &out)
            for (id, state) in records {
                appendUUID(id, to: &out)
                Varint.append(UInt64(state.fields.count), to: &out)
                for (name, register) in state.fields.sorted(by: { $0.key < $1.key }) {
                    dictionary.writeName(name, to: &out)
                    register.value.encode(into: &out)
                    dictionary.writeTimestamp(register.timestamp, to: &out)
                    dictionary.writeReplica(register.dot.replica, to: &out)
                    Varint.append(register.dot.counter, to: &out)
                    writeSupersedes(register, to: &out)
                }
                Varint.append(UInt64(state.presence.count), to: &out)
                for (replica, entry) in state.presence.sorted(by: { $0.key < $1.key }) {
                    dictionary.writeReplica(replica, to: &out)
                    Varint.append(entry.counter, to: &out)
                    if let remover = entry.removedBy {
                        out.append(1)
                        dictionary.writeReplica(remover.replica, to: &out)
                        Varint.append(remover.counter, to: &out)
                    } else {
                        out.append(0)
                    }
                }
            }
        }
        return out
    }

    public static func decode(_ bytes: [UInt8], with dictionary: WireDictionary) throws(WireError) -> RecordMap {
        var r = ByteReader(bytes)
        guard let form = r.readByte() else { throw .malformed(message: "delta", detail: "empty") }
        var records: [RecordKey: RecordState] = [:]
        let context: CausalContext
        switch form {
        case 1:
            let replica = try dictionary.readReplica(from: &r)
            let counter = try readCounter(&r)
            let dot = Dot(replica: replica, counter: counter)
            let key = RecordKey(collection: try dictionary.readName(from: &r), id: try readUUID(&r))
            var state = RecordState(presence: [replica: PresenceEntry(counter: counter, removedBy: nil)])
            var fields: [String: FieldRegister] = [:]
            for _ in 0..<(try readCount(&r)) {
                let name = try dictionary.readName(from: &r)
                let value = try readValue(&r)
                let timestamp = try dictionary.readTimestamp(from: &r)
                let supersedes = try readSupersedes(&r, timestamp: timestamp)
                guard fields[name] == nil else { throw .malformed(message: "delta", detail: "field \(name) twice") }
                fields[name] = FieldRegister(value: value, timestamp: timestamp, dot: dot, supersedes: supersedes)
            }
            state = RecordState(fields: fields, presence: state.presence)
            records[key] = state
            context = CausalContext(dots: [dot])
        case 0:
            context = try readContext(&r, with: dictionary)
            for _ in 0..<(try readCount(&r)) {
                let collection = try dictionary.readName(from: &r)
                for _ in 0..<(try readCount(&r)) {
                    let key = RecordKey(collection: collection, id: try readUUID(&r))
                    var fields: [String: FieldRegister] = [:]
                    for _ in 0..<(try readCount(&r)) {
                        let name = try dictionary.readName(from: &r)
                        let value = try readValue(&r)
                        let timestamp = try dictionary.readTimestamp(from: &r)
                        let writer = try dictionary.readReplica(from: &r)
                        let counter = try readCounter(&r)
                        let supersedes = try readSupersedes(&r, timestamp: timestamp)
                        guard fields[name] == nil else { throw .malformed(message: "delta", detail: "field \(name) twice") }
                        fields[name] = FieldRegister(value: value, timestamp: timestamp,
                                                     dot: Dot(replica: writer, counter: counter), supersedes: supersedes)
                    }
                    var presence: [ReplicaID: PresenceEntry] = [:]
                    for _ in 0..<(try readCount(&r)) {
                        let replica = try dictionary.readReplica(from: &r)
                        let counter = try readCounter(&r)
                        let removedBy: Dot?
                        switch r.readByte() {
                        case 0: removedBy = nil
                        case 1: removedBy = Dot(replica: try dictionary.readReplica(from: &r), counter: try readCounter(&r))
                        default: throw .malformed(message: "delta", detail: "bad presence flag")
                        }
                        guard presence[replica] == nil else { throw .malformed(message: "delta", detail: "presence entry twice") }
                        presence[replica] = PresenceEntry(counter: counter, removedBy: removedBy)
                    }
                    guard !fields.isEmpty || !presence.isEmpty else { throw .malformed(message: "delta", detail: "empty record") }
                    guard records[key] == nil else { throw .malformed(message: "delta", detail: "record \(key) twice") }
                    records[key] = RecordState(fields: fields, presence: presence)
                }
            }
        default:
            throw .malformed(message: "delta", detail: "unknown form \(form)")
        }
        guard r.isAtEnd else { throw .malformed(message: "delta", detail: "\(r.remaining) trailing bytes") }
        return RecordMap(records: records.map { ($0.key, $0.value) }, context: context)
    }

    /// The delta of exactly one write event, if `delta` is one.
    static func singleEvent(_ delta: RecordMap) -> (dot: Dot, key: RecordKey, state: RecordState)? {
        guard delta.collections.count == 1, delta.context.versionVector.isEmpty, delta.context.cloudDotCount == 1,
              let (replica, cloud) = delta.context.dotCloud.first, let counter = cloud.first,
              let (key, state) = delta.allRecords.first, delta.recordCount == 1,
              state.presence == [replica: PresenceEntry(counter: counter, removedBy: nil)],
              state.fields.values.allSatisfy({ $0.dot == Dot(replica: replica, counter: counter) })
        else { return nil }
        return (Dot(replica: replica, counter: counter), key, state)
    }

    static func writeContext(_ context: CausalContext, with dictionary: WireDictionary, to out: inout [UInt8]) {
        let replicas = context.replicas.sorted()
        Varint.append(UInt64(replicas.count), to: &out)
        for replica in replicas {
            dictionary.writeReplica(replica, to: &out)
            let contiguous = context.contiguousCounter(of: replica)
            Varint.append(contiguous, to: &out)
            let cloud = (context.dotCloud[replica] ?? []).sorted()
            Varint.append(UInt64(cloud.count), to: &out)
            var previous = contiguous
            for counter in cloud {
                Varint.append(counter - previous, to: &out)
                previous = counter
            }
        }
    }

    static func readContext(_ r: inout ByteReader, with dictionary: WireDictionary) throws(WireError) -> CausalContext {
        var context = CausalContext()
        var seen = Set<ReplicaID>()
        for _ in 0..<(try readCount(&r)) {
            let replica = try dictionary.readReplica(from: &r)
            guard seen.insert(replica).inserted else { throw .malformed(message: "delta", detail: "context names a replica twice") }
            guard var previous = r.readVarint() else { throw .malformed(message: "delta", detail: "truncated context") }
            if previous > 0 { context.merge(CausalContext(versionVector: [replica: previous])) }
            for _ in 0..<(try readCount(&r)) {
                guard let gap = r.readVarint(), gap >= 1 else { throw .malformed(message: "delta", detail: "bad context gap") }
                let (next, overflow) = previous.addingReportingOverflow(gap)
                guard !overflow else { throw .malformed(message: "delta", detail: "context counter overflow") }
                context.insert(Dot(replica: replica, counter: next))
                previous = next
            }
        }
        return context
    }

    static func writeSupersedes(_ register: FieldRegister, to out: inout [UInt8]) {
        if register.supersedes == .zero {
            out.append(0)
        } else {
            Varint.append(1 + register.timestamp.physicalMilliseconds - register.supersedes.physicalMilliseconds, to: &out)
            Varint.append(UInt64(register.supersedes.logical), to: &out)
        }
    }

    static func readSupersedes(_ r: inout ByteReader, timestamp: HLCTimestamp) throws(WireError) -> HLCTimestamp {
        guard let back = r.readVarint() else { throw .malformed(message: "delta", detail: "truncated supersedes") }
        if back == 0 { return .zero }
        guard let logical = r.readVarint(), logical <= UInt64(UInt16.max), back - 1 <= timestamp.physicalMilliseconds else {
            throw .malformed(message: "delta", detail: "bad supersedes")
        }
        let supersedes = HLCTimestamp(physicalMilliseconds: timestamp.physicalMilliseconds - (back - 1), logical: UInt16(logical))
        guard supersedes < timestamp else { throw .malformed(message: "delta", detail: "a field supersedes a later value") }
        return supersedes
    }

    static func readCount(_ r: inout ByteReader) throws(WireError) -> Int {
        guard let n = r.readVarint(), n <= UInt64(r.remaining) else { throw .malformed(message: "delta", detail: "count beyond the frame") }
        return Int(n)
    }

    static func readCounter(_ r: inout ByteReader) throws(WireError) -> UInt64 {
        guard let c = r.readVarint(), c >= 1 else { throw .malformed(message: "delta", detail: "bad counter") }
        return c
    }

    static func readValue(_ r: inout ByteReader) throws(WireError) -> FieldValue {
        do {
            return try FieldValue.decode(from: &r, depth: 0)
        } catch {
            throw .malformed(message: "delta", detail: "\(error)")
        }
    }

    static func appendUUID(_ id: UUID, to out: inout [UInt8]) {
        withUnsafeBytes(of: id.uuid) { out.append(contentsOf: $0) }
    }

    static func readUUID(_ r: inout ByteReader) throws(WireError) -> UUID {
        guard let b = r.readBytes(16) else { throw .malformed(message: "delta", detail: "truncated record ID") }
        let a = Array(b)
        return UUID(uuid: (a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15]))
    }
}
