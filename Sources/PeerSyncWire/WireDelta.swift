@_spi(Engine) import PeerSyncCRDT

/// The session encoding of a ``RecordMap`` (a delta, a catch-up chunk, or a whole state).
/// Replica IDs, collection and field names go through the session's ``WireDictionary``.
///
/// ```
/// delta       = 00 general | 01 event | 02 event-next
///
/// general     = context varint(#collections) (name-ref varint(#records) record…)…
/// context     = varint(#replicas) (replica-ref varint(contiguous) varint(#cloud) varint(gap)…)…
///               (cloud counters ascending; each gap is the distance from the previous counter,
///                the first from `contiguous`; gaps are ≥ 1)
/// record      = 16-byte UUID varint(flags) [base] varint(#fields) field… [varint(#presence) presence…]
///   flags bit 0: a base follows (the timestamp and dot most of the record's fields share)
///   flags bit 1: the presence is exactly {base writer: (base counter, live)} and is not listed
/// base        = zigzag-varint(raw timestamp − previous record's base raw timestamp)
///               replica-ref(writer) zigzag-varint(counter − previous record's base counter)
///               (records are sent sorted by base dot, so both differences are small)
/// field       = name-ref value varint(kind) [zigzag-varint(raw timestamp − base raw timestamp)]
///               [replica-ref(writer) varint(counter)] [supersedes]
///   kind bit 0: own timestamp follows; bit 1: own dot follows; bit 2: supersedes follows
///   (without bit 0/1 the field has the base's timestamp/dot; without bit 2 it supersedes nothing)
/// presence    = replica-ref varint(counter) 00
///             | replica-ref varint(counter) 01 replica-ref(remover) varint(remover counter)
///
/// event       = replica-ref varint(counter) name-ref(collection) 16-byte UUID
///               varint(#fields) (name-ref value timestamp supersedes)…
///   — one local write: its context is exactly the dot (replica, counter), every field was
///     written by that dot, and the record's presence entry for the replica is (counter, live).
/// event-next  = replica-ref varint(counter − last − 1) then as event after its counter, where
///               `last` is the counter of the replica's previous event (01 or 02) in this
///               direction, 0 if none; sent only to a peer that announced
///               ``HelloFeatures/eventCounters``. Both event forms set `last` to their counter.
///
/// timestamp   = zigzag-varint(physical ms − previous physical ms in this direction) varint(logical)
/// supersedes  = 00 (none) | varint(1 + physical ms difference to the field's timestamp) varint(logical)
///               (in a general-form field, kind bit 2 replaces the 00 case: present means non-zero)
/// raw timestamp = the 64-bit packed HLC (physical ms << 16 | logical); differences wrap mod 2⁶⁴
/// value       = FieldValue canonical encoding (docs/PROTOCOL.md)
/// ```
package enum WireDelta {
    package static func encode(_ delta: RecordMap, with dictionary: WireDictionary) -> [UInt8] {
        var out: [UInt8] = []
        if let event = singleEvent(delta) {
            out.append(1)
            let writer = dictionary.writeReplica(event.dot.replica, to: &out)
            let last = dictionary.lastEventCounters[writer]
            if dictionary.relativeEventCounters, event.dot.counter > last {
                out[0] = 2
                Varint.append(event.dot.counter - last - 1, to: &out)
            } else {
                Varint.append(event.dot.counter, to: &out)
            }
            dictionary.lastEventCounters[writer] = event.dot.counter
            dictionary.writeName(event.key.collection, to: &out)
            appendUUID(event.key.id, to: &out)
            Varint.append(UInt64(event.state.fields.count), to: &out)
            for (name, register) in event.state.fields {
                dictionary.writeName(name, to: &out)
                register.value.encode(into: &out)
                dictionary.writeTimestamp(register.timestamp, to: &out)
                writeSupersedes(register, to: &out)
            }
            return out
        }
        return encode(records: delta.allRecords, context: delta.context, with: dictionary, into: out)
    }

    /// The general form of the given records and context (a catch-up chunk is encoded straight
    /// from a slice of the state's records this way, without building a map for it).
    package static func encode(
        records: some Collection<(RecordKey, RecordState)>, context: CausalContext, with dictionary: WireDictionary
    ) -> [UInt8] {
        encode(records: records, context: context, with: dictionary, into: [])
    }

    static func encode(
        records: some Collection<(RecordKey, RecordState)>, context: CausalContext, with dictionary: WireDictionary,
        into prefix: [UInt8]
    ) -> [UInt8] {
        var out = prefix
        var byCollection: [String: [(UUID, RecordState)]] = [:]
        for (key, state) in records { byCollection[key.collection, default: []].append((key.id, state)) }
        out.append(0)
        writeContext(context, with: dictionary, to: &out)
        Varint.append(UInt64(byCollection.count), to: &out)
        var previous = (time: UInt64(dictionary.lastPhysical) << 16, counter: UInt64(0))
        for (collection, records) in byCollection.sorted(by: { $0.key < $1.key }) {
            dictionary.writeName(collection, to: &out)
            Varint.append(UInt64(records.count), to: &out)
            let ordered = records.map { (id: $0.0, state: $0.1, base: base(of: $0.1)) }
                .sorted { order(of: $0.base) < order(of: $1.base) }
            for record in ordered {
                appendUUID(record.id, to: &out)
                let simplePresence = record.base.map { base in
                    record.state.presence.count == 1 && record.state.presence[0].key == base.dot.replica
                        && record.state.presence[0].value == PresenceEntry(counter: base.dot.counter, removedBy: nil)
                } ?? false
                out.append((record.base == nil ? 0 : 1) | (simplePresence ? 2 : 0))
                if let base = record.base {
                    appendZigzag(Int64(bitPattern: base.timestamp.rawValue &- previous.time), to: &out)
                    dictionary.writeReplica(base.dot.replica, to: &out)
                    appendZigzag(Int64(bitPattern: base.dot.counter &- previous.counter), to: &out)
                    previous = (base.timestamp.rawValue, base.dot.counter)
                }
                Varint.append(UInt64(record.state.fields.count), to: &out)
                for (name, register) in record.state.fields {
                    dictionary.writeName(name, to: &out)
                    register.value.encode(into: &out)
                    let ownTime = register.timestamp != record.base?.timestamp
                    let ownDot = register.dot != record.base?.dot
                    let hasSupersedes = register.supersedes != .zero
                    out.append((ownTime ? 1 : 0) | (ownDot ? 2 : 0) | (hasSupersedes ? 4 : 0))
                    if ownTime {
                        appendZigzag(Int64(bitPattern: register.timestamp.rawValue &- (record.base?.timestamp.rawValue ?? previous.time)), to: &out)
                    }
                    if ownDot {
                        dictionary.writeReplica(register.dot.replica, to: &out)
                        Varint.append(register.dot.counter, to: &out)
                    }
                    if hasSupersedes { writeSupersedes(register, to: &out) }
                }
                if !simplePresence {
                    Varint.append(UInt64(record.state.presence.count), to: &out)
                    for (replica, entry) in record.state.presence {
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
        }
        return out
    }

    /// Where a record goes in a delta: records are encoded in order of their base dot (records
    /// without fields first), so consecutive bases differ by little and cost a byte or two. A
    /// catch-up round cut into many chunks orders its records the same way before cutting.
    package static func sendOrder(of state: RecordState) -> Dot {
        order(of: base(of: state))
    }

    private static func order(of base: (timestamp: HLCTimestamp, dot: Dot)?) -> Dot {
        base?.dot ?? Dot(replica: ReplicaID(high: 0, low: 0), counter: 0)
    }

    /// The (timestamp, dot) most fields of a record share; nil for a record without fields.
    static func base(of state: RecordState) -> (timestamp: HLCTimestamp, dot: Dot)? {
        var best: (timestamp: HLCTimestamp, dot: Dot)?
        var bestCount = 0
        for register in state.fields.values {
            let count = state.fields.values.reduce(0) { $0 + ($1.timestamp == register.timestamp && $1.dot == register.dot ? 1 : 0) }
            if count > bestCount || (count == bestCount && best.map { (register.dot, register.timestamp) < ($0.dot, $0.timestamp) } == true) {
                best = (register.timestamp, register.dot)
                bestCount = count
            }
        }
        return best
    }

    static func appendZigzag(_ value: Int64, to out: inout [UInt8]) {
        Varint.append(UInt64(bitPattern: (value << 1) ^ (value >> 63)), to: &out)
    }

    static func readZigzag(_ r: inout ByteReader) throws(WireError) -> Int64 {
        guard let raw = r.readVarint() else { throw .malformed(message: "delta", detail: "truncated number") }
        return Int64(bitPattern: (raw >> 1) ^ (0 &- (raw & 1)))
    }

    package static func decode(_ bytes: [UInt8], with dictionary: WireDictionary) throws(WireError) -> RecordMap {
        var r = ByteReader(bytes)
        guard let form = r.readByte() else { throw .malformed(message: "delta", detail: "empty") }
        // Records go straight into collection → ID → state, the map's own layout: no
        // intermediate dictionary keyed by (collection, ID) to hash every record twice.
        var collections: [String: [UUID: RecordState]] = [:]
        let context: CausalContext
        switch form {
        case 1, 2:
            let writer = try dictionary.readReplicaIndex(from: &r)
            let replica = dictionary.replica(at: writer)
            let counter: UInt64
            if form == 1 {
                counter = try readCounter(&r)
            } else {
                let last = dictionary.lastEventCounters[writer]
                guard let distance = r.readVarint(), distance < ValidationLimits.maxCounter - last else {
                    throw .malformed(message: "delta", detail: "event counter past \(ValidationLimits.maxCounter)")
                }
                counter = last + 1 + distance
            }
            dictionary.lastEventCounters[writer] = counter
            let dot = Dot(replica: replica, counter: counter)
            let key = RecordKey(collection: try dictionary.readName(from: &r), id: try readUUID(&r))
            var state = RecordState(presence: [replica: PresenceEntry(counter: counter, removedBy: nil)])
            var fields: SortedMap<String, FieldRegister> = SortedMap()
            for _ in 0..<(try readCount(&r)) {
                let name = try dictionary.readName(from: &r)
                let value = try readValue(&r)
                let timestamp = try dictionary.readTimestamp(from: &r)
                let supersedes = try readSupersedes(&r, timestamp: timestamp)
                let register = FieldRegister(value: value, timestamp: timestamp, dot: dot, supersedes: supersedes)
                guard fields.updateValue(register, forKey: name) == nil else { throw .malformed(message: "delta", detail: "field \(name) twice") }
            }
            state = RecordState(fields: fields, presence: state.presence)
            collections[key.collection] = [key.id: state]
            context = CausalContext(dots: [dot])
        case 0:
            context = try readContext(&r, with: dictionary)
            var previous = (time: UInt64(dictionary.lastPhysical) << 16, counter: UInt64(0))
            for _ in 0..<(try readCount(&r)) {
                let collection = try dictionary.readName(from: &r)
                var records = collections.removeValue(forKey: collection) ?? [:]
                defer { if !records.isEmpty { collections[collection] = records } }
                for _ in 0..<(try readCount(&r)) {
                    let key = RecordKey(collection: collection, id: try readUUID(&r))
                    guard let flags = r.readByte(), flags < 4 else { throw .malformed(message: "delta", detail: "bad record flags") }
                    var base: (timestamp: HLCTimestamp, dot: Dot)?
                    if flags & 1 != 0 {
                        let time = previous.time &+ UInt64(bitPattern: try readZigzag(&r))
                        let writer = try dictionary.readReplica(from: &r)
                        let counter = previous.counter &+ UInt64(bitPattern: try readZigzag(&r))
                        guard ValidationLimits.isValidCounter(counter) else {
                            throw .malformed(message: "delta", detail: "record base counter \(counter) outside 1...\(ValidationLimits.maxCounter)")
                        }
                        guard time <= ValidationLimits.maxTimestamp.rawValue else {
                            throw .malformed(message: "delta", detail: "record base timestamp after the year 9999")
                        }
                        base = (HLCTimestamp(rawValue: time), Dot(replica: writer, counter: counter))
                        previous = (time, counter)
                    } else if flags & 2 != 0 {
                        throw .malformed(message: "delta", detail: "implied presence without a base")
                    }
                    var fields: SortedMap<String, FieldRegister> = SortedMap()
                    for _ in 0..<(try readCount(&r)) {
                        let name = try dictionary.readName(from: &r)
                        let value = try readValue(&r)
                        guard let kind = r.readByte(), kind < 8 else { throw .malformed(message: "delta", detail: "bad field kind") }
                        var timestamp = base?.timestamp
                        var dot = base?.dot
                        if kind & 1 != 0 {
                            let raw = (base?.timestamp.rawValue ?? previous.time) &+ UInt64(bitPattern: try readZigzag(&r))
                            guard raw <= ValidationLimits.maxTimestamp.rawValue else {
                                throw .malformed(message: "delta", detail: "field timestamp after the year 9999")
                            }
                            timestamp = HLCTimestamp(rawValue: raw)
                        }
                        if kind & 2 != 0 {
                            dot = Dot(replica: try dictionary.readReplica(from: &r), counter: try readCounter(&r))
                        }
                        guard let timestamp, let dot else { throw .malformed(message: "delta", detail: "field without timestamp or dot") }
                        let supersedes = kind & 4 != 0 ? try readSupersedes(&r, timestamp: timestamp) : .zero
                        guard kind & 4 == 0 || supersedes != .zero else { throw .malformed(message: "delta", detail: "bad supersedes") }
                        let register = FieldRegister(value: value, timestamp: timestamp, dot: dot, supersedes: supersedes)
                        guard fields.updateValue(register, forKey: name) == nil else { throw .malformed(message: "delta", detail: "field \(name) twice") }
                    }
                    var presence: SortedMap<ReplicaID, PresenceEntry> = SortedMap()
                    if flags & 2 != 0, let base {
                        presence[base.dot.replica] = PresenceEntry(counter: base.dot.counter, removedBy: nil)
                    } else {
                        for _ in 0..<(try readCount(&r)) {
                            let replica = try dictionary.readReplica(from: &r)
                            let counter = try readCounter(&r)
                            let removedBy: Dot?
                            switch r.readByte() {
                            case 0: removedBy = nil
                            case 1: removedBy = Dot(replica: try dictionary.readReplica(from: &r), counter: try readCounter(&r))
                            default: throw .malformed(message: "delta", detail: "bad presence flag")
                            }
                            guard presence.updateValue(PresenceEntry(counter: counter, removedBy: removedBy), forKey: replica) == nil else {
                                throw .malformed(message: "delta", detail: "presence entry twice")
                            }
                        }
                    }
                    guard !fields.isEmpty || !presence.isEmpty else { throw .malformed(message: "delta", detail: "empty record") }
                    guard records.updateValue(RecordState(fields: fields, presence: presence), forKey: key.id) == nil else {
                        throw .malformed(message: "delta", detail: "record \(key) twice")
                    }
                }
            }
        default:
            throw .malformed(message: "delta", detail: "unknown form \(form)")
        }
        guard r.isAtEnd else { throw .malformed(message: "delta", detail: "\(r.remaining) trailing bytes") }
        return RecordMap(collections: collections, context: context)
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
        context.encode(into: &out) { replica, out in dictionary.writeReplica(replica, to: &out) }
    }

    static func readContext(_ r: inout ByteReader, with dictionary: WireDictionary) throws(WireError) -> CausalContext {
        do {
            return try CausalContext.decode(from: &r) { reader in try dictionary.readReplica(from: &reader) }
        } catch let error as WireError {
            throw error
        } catch {
            throw .malformed(message: "delta", detail: "context: \(error)")
        }
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

    /// An event counter: 1 through ``ValidationLimits/maxCounter``.
    static func readCounter(_ r: inout ByteReader) throws(WireError) -> UInt64 {
        guard let c = r.readVarint() else { throw .malformed(message: "delta", detail: "truncated counter") }
        guard ValidationLimits.isValidCounter(c) else {
            throw .malformed(message: "delta", detail: "counter \(c) outside 1...\(ValidationLimits.maxCounter)")
        }
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
        let i = b.startIndex  // no copy: index the slice
        return UUID(uuid: (b[i], b[i + 1], b[i + 2], b[i + 3], b[i + 4], b[i + 5], b[i + 6], b[i + 7],
                           b[i + 8], b[i + 9], b[i + 10], b[i + 11], b[i + 12], b[i + 13], b[i + 14], b[i + 15]))
    }
}
