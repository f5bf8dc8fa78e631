/// Compact binary forms of CRDT state, for storage and the wire.
///
/// Every blob starts with a table of the replica IDs it mentions, so a 16-byte ID appears once
/// per blob and is referred to by a varint index after that:
///
/// ```
/// blob          = replica-table body
/// replica-table = varint(n) n × 16-byte replica ID (high 8 bytes big-endian, then low 8)
/// ```
///
/// Decoding never traps: every count is checked against the bytes left, every index against the
/// table, every number against ``ValidationLimits`` (counters in 1...2⁵³, timestamps up to the
/// year 9999, at most 10,000 replicas and 100,000 cloud dots per context, nesting ≤ 64), and
/// state invariants (unique names, `supersedes < timestamp`) are checked, so bytes from a
/// hostile peer or a damaged file produce a ``BinaryDecodingError``, not a crash, a stall or a
/// state that breaks the join laws. Limits on sizes are checked before anything is allocated.
package enum BinaryDecodingError: Error, Equatable, CustomStringConvertible {
    case truncated(String)
    case invalid(String)
    case unsupportedVersion(UInt8)

    public var description: String {
        switch self {
        case .truncated(let what): "truncated \(what)"
        case .invalid(let what): "invalid \(what)"
        case .unsupportedVersion(let v): "unsupported encoding version \(v)"
        }
    }
}

// MARK: - RecordState

extension RecordState {
    /// ```
    /// record   = varint(base) varint(#fields) field… varint(#presence) presence…
    /// field    = string(name) value varint(timestamp − base) varint(writer) varint(counter)
    ///            varint(supersedes == 0 ? 0 : timestamp − supersedes)
    /// presence = varint(replica) varint(counter) 00            (live)
    ///          | varint(replica) varint(counter) 01 varint(remover) varint(remover counter)
    /// ```
    /// `base` is the smallest field timestamp, so fields written together cost one byte each.
    /// Fields and presence entries go in the order their maps keep (name, replica).
    func encode(into w: inout BlobWriter) {
        var base = fields.isEmpty ? 0 : UInt64.max
        for entry in fields.entries { base = min(base, entry.value.timestamp.rawValue) }
        w.varint(base)
        w.varint(UInt64(fields.count))
        // Through the storage buffer: iterating the map would copy each (name, register) pair.
        fields.entries.withUnsafeBufferPointer { entries in
            for i in entries.indices {
                w.string(entries[i].key)
                entries[i].value.value.encode(into: &w.body)
                let timestamp = entries[i].value.timestamp.rawValue
                w.varint(timestamp &- base)
                w.replica(entries[i].value.dot.replica)
                w.varint(entries[i].value.dot.counter)
                let supersedes = entries[i].value.supersedes
                w.varint(supersedes == .zero ? 0 : timestamp &- supersedes.rawValue)
            }
        }
        w.varint(UInt64(presence.count))
        for entry in presence.entries {
            w.replica(entry.key)
            w.varint(entry.value.counter)
            if let removedBy = entry.value.removedBy {
                w.varint(1)
                w.replica(removedBy.replica)
                w.varint(removedBy.counter)
            } else {
                w.varint(0)
            }
        }
    }

    static func decode(from r: inout BlobReader) throws(BinaryDecodingError) -> RecordState {
        var state = RecordState()
        let base = try r.varint("record base timestamp")
        let fieldCount = try r.count("field count")
        state.fields.reserveCapacity(min(fieldCount, 32))
        for _ in 0..<fieldCount {
            let name = try r.string("field name")
            let value = try r.value("field \(name) value")
            let offset = try r.varint("field timestamp")
            let (timestamp, overflow) = base.addingReportingOverflow(offset)
            guard !overflow, timestamp <= ValidationLimits.maxTimestamp.rawValue else {
                throw .invalid("field \(name) timestamp (after the year 9999)")
            }
            let writer = try r.replica("field writer")
            let counter = try r.counter("field dot")
            let back = try r.varint("field supersedes")
            guard back <= timestamp else { throw .invalid("field \(name) supersedes a later value") }
            let supersedes = back == 0 ? HLCTimestamp.zero : HLCTimestamp(rawValue: timestamp - back)
            let register = FieldRegister(value: value, timestamp: HLCTimestamp(rawValue: timestamp),
                                         dot: Dot(replica: writer, counter: counter), supersedes: supersedes)
            guard state.fields.updateValue(register, forKey: name) == nil else { throw .invalid("record (field \(name) twice)") }
        }
        let presenceCount = try r.count("presence count")
        for _ in 0..<presenceCount {
            let replica = try r.replica("presence replica")
            let counter = try r.counter("presence counter")
            let removedBy: Dot?
            switch try r.varint("presence flag") {
            case 0: removedBy = nil
            case 1: removedBy = Dot(replica: try r.replica("remover"), counter: try r.counter("remover counter"))
            default: throw .invalid("presence flag")
            }
            guard state.presence.updateValue(PresenceEntry(counter: counter, removedBy: removedBy), forKey: replica) == nil else {
                throw .invalid("record (presence entry twice)")
            }
        }
        guard !state.isEmpty else { throw .invalid("record (empty)") }
        return state
    }

    /// The record as one self-contained blob (the store keeps one per record).
    public func encodedBlob() -> [UInt8] {
        // The replica table precedes the body but lists replicas in their order of use in it:
        // found first, it is written up front and the body follows in the same buffer (a
        // store writes one blob per record changed; a fresh peer's catch-up, 10⁴–10⁵ of them).
        // One pass over the fields finds the replicas in order of use and sizes the body, so
        // the buffer is allocated once (growing it mid-record showed in a heal's profile).
        var replicas: [ReplicaID] = []
        replicas.reserveCapacity(2)
        func use(_ replica: ReplicaID) { if !replicas.contains(replica) { replicas.append(replica) } }
        var estimate = 8 + presence.count * 12
        fields.entries.withUnsafeBufferPointer { entries in
            for i in entries.indices {
                use(entries[i].value.dot.replica)
                estimate += entries[i].key.utf8.count + 16
                switch entries[i].value.value {
                case .string(let s): estimate += s.utf8.count + 3
                case .bytes(let b): estimate += b.count + 3
                default: estimate += 17
                }
            }
        }
        for entry in presence.entries {
            use(entry.key)
            if let removedBy = entry.value.removedBy { use(removedBy.replica) }
        }
        var w = BlobWriter(table: replicas, bodyCapacity: estimate)
        encode(into: &w)
        return w.finishWithTableFirst()
    }

    public init(blob: [UInt8]) throws(BinaryDecodingError) {
        var r = try BlobReader(blob)
        self = try RecordState.decode(from: &r)
        try r.expectEnd("record")
    }
}

// MARK: - CausalContext

extension CausalContext {
    /// ```
    /// context = varint(#replicas) (varint(replica) varint(contiguous) varint(#cloud) varint(gap)…)…
    /// ```
    /// Cloud counters are ascending, each written as its distance from the previous one (the
    /// first from `contiguous`), so every gap is ≥ 1.
    func encode(into w: inout BlobWriter) {
        var table = w.table
        encode(into: &w.body) { replica, out in Varint.append(table.index(of: replica), to: &out) }
        w.table = table
    }

    /// Appends the entries in the layout above, writing each replica with `writeReplica` (a
    /// blob's table index, or a session dictionary reference on the wire).
    public func encode(into out: inout [UInt8], writeReplica: (ReplicaID, inout [UInt8]) -> Void) {
        let replicas = replicas.sorted()
        Varint.append(UInt64(replicas.count), to: &out)
        for replica in replicas {
            let contiguous = versionVector[replica] ?? 0
            writeReplica(replica, &out)
            Varint.append(contiguous, to: &out)
            let cloud = (dotCloud[replica] ?? []).sorted()
            Varint.append(UInt64(cloud.count), to: &out)
            var previous = contiguous
            for counter in cloud {
                Varint.append(counter - previous, to: &out)
                previous = counter
            }
        }
    }

    static func decode(from r: inout BlobReader) throws(BinaryDecodingError) -> CausalContext {
        let table = r.table
        do {
            return try decode(from: &r.reader) { reader throws(BinaryDecodingError) in
                guard let index = reader.readVarint() else { throw .truncated("context replica") }
                guard index < UInt64(table.count) else { throw .invalid("context replica (index \(index) of \(table.count))") }
                return table[Int(index)]
            }
        } catch let error as BinaryDecodingError {
            throw error
        } catch {
            throw .invalid("context: \(error)")
        }
    }

    /// Reads the entries of ``encode(into:writeReplica:)``, reading each replica with
    /// `readReplica`. Every count is checked against the bytes left and against
    /// ``ValidationLimits`` (replicas, cloud dots, counters) before anything is built, so an
    /// over-limit context is refused at the cost of reading its first numbers.
    ///
    /// - Complexity: O(bytes read).
    public static func decode(from reader: inout ByteReader, readReplica: (inout ByteReader) throws -> ReplicaID) throws -> CausalContext {
        guard let count = reader.readVarint(), count <= UInt64(reader.remaining) else { throw BinaryDecodingError.truncated("context size") }
        guard count <= UInt64(ValidationLimits.maxContextReplicas) else {
            throw BinaryDecodingError.invalid("context names \(count) replicas (limit \(ValidationLimits.maxContextReplicas))")
        }
        var context = CausalContext()
        var seen = Set<ReplicaID>(minimumCapacity: Int(count))
        var cloudDots: UInt64 = 0
        var cloud: [UInt64] = []
        for _ in 0..<count {
            let replica = try readReplica(&reader)
            guard seen.insert(replica).inserted else { throw BinaryDecodingError.invalid("context (replica twice)") }
            guard let contiguous = reader.readVarint() else { throw BinaryDecodingError.truncated("context counter") }
            guard contiguous <= ValidationLimits.maxCounter else {
                throw BinaryDecodingError.invalid("context counter \(contiguous) (limit \(ValidationLimits.maxCounter))")
            }
            guard let cloudCount = reader.readVarint(), cloudCount <= UInt64(reader.remaining) else {
                throw BinaryDecodingError.truncated("context cloud size")
            }
            guard cloudCount <= UInt64(ValidationLimits.maxCloudDots) - cloudDots else {
                throw BinaryDecodingError.invalid("context holds over \(ValidationLimits.maxCloudDots) out-of-order dots")
            }
            cloudDots += cloudCount
            cloud.removeAll(keepingCapacity: true)
            var previous = contiguous
            for _ in 0..<cloudCount {
                guard let gap = reader.readVarint() else { throw BinaryDecodingError.truncated("context cloud gap") }
                guard gap >= 1 else { throw BinaryDecodingError.invalid("context cloud gap 0") }
                guard gap <= ValidationLimits.maxCounter - previous else {  // previous ≤ maxCounter: no underflow
                    throw BinaryDecodingError.invalid("context cloud counter beyond \(ValidationLimits.maxCounter)")
                }
                previous += gap
                cloud.append(previous)
            }
            context.setDecodedEntry(replica, contiguous: contiguous, ascendingCloud: cloud)
        }
        return context
    }

    public func encodedBlob() -> [UInt8] {
        var w = BlobWriter()
        encode(into: &w)
        return w.finish()
    }

    public init(blob: [UInt8]) throws(BinaryDecodingError) {
        var r = try BlobReader(blob, maxTable: ValidationLimits.maxContextReplicas)
        self = try CausalContext.decode(from: &r)
        try r.expectEnd("context")
    }
}

// MARK: - RecordMap

extension RecordMap {
    /// Version byte of ``encoded()``.
    public static let encodingVersion: UInt8 = 1

    /// ```
    /// map = 01 replica-table context varint(#collections)
    ///       (string(collection) varint(#records) (16-byte record UUID, record)…)…
    /// ```
    public func encoded() -> [UInt8] {
        var w = BlobWriter()
        context.encode(into: &w)
        w.varint(UInt64(collections.count))
        for (collection, records) in collections.sorted(by: { $0.key < $1.key }) {
            w.string(collection)
            w.varint(UInt64(records.count))
            for (id, state) in records {
                w.uuid(id)
                state.encode(into: &w)
            }
        }
        return w.finish(prefix: [Self.encodingVersion])
    }

    public init(decoding bytes: [UInt8]) throws(BinaryDecodingError) {
        guard let version = bytes.first else { throw .truncated("delta") }
        guard version == Self.encodingVersion else { throw .unsupportedVersion(version) }
        var r = try BlobReader(bytes, skipping: 1)
        let context = try CausalContext.decode(from: &r)
        var map = RecordMap.withoutDigest()
        let collectionCount = try r.count("collection count")
        for _ in 0..<collectionCount {
            let collection = try r.string("collection name")
            guard map.collections[collection] == nil else { throw .invalid("delta (collection \(collection) twice)") }
            let recordCount = try r.count("record count")
            for _ in 0..<recordCount {
                let key = RecordKey(collection: collection, id: try r.uuid("record ID"))
                let state = try RecordState.decode(from: &r)
                guard map.record(key) == nil else { throw .invalid("delta (record \(key) twice)") }
                map.insert(key, state)
            }
        }
        try r.expectEnd("delta")
        map.setContext(context)
        self = map
    }
}
