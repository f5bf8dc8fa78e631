@_spi(Engine) import PeerSyncCRDT

/// Upper bounds of encoded sizes, so a sender can cut frames that never exceed the limit its
/// peer announced, without encoding twice.
///
/// Every bound assumes the worst case for each varint (10 bytes; 3 for dictionary references,
/// which index at most 65,536 entries) and a full definition for every replica ID and name the
/// dictionary does not know yet. The dictionary only ever grows, so a bound computed now stays
/// valid when the record is encoded later.
extension WireDelta {
    /// Bytes a frame adds around a chunk's delta: frame length and type, the chunk's index, count
    /// and records fields, and the delta field's tag and length.
    package static let chunkOverheadBound = 5 + 1 + 3 * 11 + 1 + 5

    /// Bytes a frame adds around a delta message (frame length and type).
    package static let deltaOverheadBound = 5 + 1

    /// An upper bound of the bytes `record` adds to a general-form delta encoded with `dictionary`,
    /// including its share of the collection header.
    package static func encodedSizeBound(of key: RecordKey, _ state: RecordState, with dictionary: WireDictionary) -> Int {
        var total = nameBound(key.collection, dictionary) + 10  // collection header, counted per record
        total += 16 + 1 + 10 + 17 + 10 + 10  // id, flags, base (timestamp, writer, counter), #fields
        for (name, register) in state.fields {
            total += nameBound(name, dictionary) + register.value.encodedSize + 1 + 10
            total += replicaBound(register.dot.replica, dictionary) + 10 + 13
        }
        total += 10
        for (replica, entry) in state.presence {
            total += replicaBound(replica, dictionary) + 10 + 1
            if let remover = entry.removedBy { total += replicaBound(remover.replica, dictionary) + 10 }
        }
        return total
    }

    /// An upper bound of the bytes a general-form delta's header and `context` take.
    package static func contextSizeBound(_ context: CausalContext, with dictionary: WireDictionary) -> Int {
        var total = 1 + 10 + 10  // form byte, #replicas, #collections
        for replica in context.replicas {
            total += replicaBound(replica, dictionary) + 10 + 10
            // A cloud counter is written as its gap from the previous one, never larger than
            // the counter itself (a flat 10 bytes per dot made a batch of 33,000 writes "too
            // large" for any chunk).
            context.forEachEntry(of: replica) { counter, inCloud in if inCloud { total += Varint.size(of: counter) } }
        }
        return total
    }

    static func replicaBound(_ id: ReplicaID, _ dictionary: WireDictionary) -> Int { dictionary.knows(id) ? 3 : 17 }
    static func nameBound(_ name: String, _ dictionary: WireDictionary) -> Int {
        dictionary.knows(name: name) ? 3 : 1 + 5 + name.utf8.count
    }
}

extension FieldValue {
    /// Exact size of the canonical encoding (§5.3 of docs/PROTOCOL.md).
    package var encodedSize: Int {
        switch self {
        case .null, .bool: 1
        case .int(let v): 1 + Varint.size(of: UInt64(bitPattern: (v << 1) ^ (v >> 63)))
        case .double: 9
        case .string(let s): 1 + Varint.size(of: UInt64(s.utf8.count)) + s.utf8.count
        case .bytes(let b): 1 + Varint.size(of: UInt64(b.count)) + b.count
        case .list(let items): 1 + Varint.size(of: UInt64(items.count)) + items.reduce(0) { $0 + $1.encodedSize }
        case .map(let entries):
            1 + Varint.size(of: UInt64(entries.count))
                + entries.reduce(0) { $0 + Varint.size(of: UInt64($1.key.utf8.count)) + $1.key.utf8.count + $1.value.encodedSize }
        case .uuid: 17
        }
    }
}
