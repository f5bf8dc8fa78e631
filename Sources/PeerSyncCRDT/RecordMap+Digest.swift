/// The digest's elements (``RecordMap/digest``): each field register, presence entry and context
/// entry hashes to one ``StableHasher`` value, and the digest is their sum, kept current by the
/// join in O(elements that change).
extension RecordMap {
    /// Joins `other` into the context and moves the maintained digest's cloud elements with it
    /// (vector entries are not maintained: ``digest`` adds them when read).
    mutating func mergeContext(_ other: CausalContext) {
        if other.isEmpty { return }
        guard maintainedDigest != nil else {
            context.merge(other)
            return
        }
        // One event that continues its writer's vector entry (a write or delete ships the
        // context of its one dot): two lookups, no hashing, no cloud walk.
        if let dot = other.onlyDot, context.extendVector(with: dot) != nil { return }
        // O(what changes), not O(cloud): a delta accumulating one replica's writes keeps them
        // all in its cloud, and rehashing it per merge made building one quadratic.
        var digest = maintainedDigest!
        context.merge(other) { replica, counter, added in
            let element = Self.contextEntryHash(replica, counter, inCloud: true)
            if added { digest.add(element) } else { digest.remove(element) }
        }
        maintainedDigest = digest
    }

    // MARK: - Digest elements

    static func hash(_ key: RecordKey, _ field: String, _ register: FieldRegister) -> (UInt64, UInt64) {
        hash(fieldsOf: fieldHashPrefix(key), field, register)
    }

    /// The hasher after the part every field element of record `key` starts with; copied
    /// for each field of a record hashed whole.
    static func fieldHashPrefix(_ key: RecordKey) -> StableHasher {
        var h = StableHasher()
        h.combine(UInt8(1))
        h.combine(key.collection)
        h.combine(key.id)
        return h
    }

    /// ``hash(_:_:_:)-(RecordKey,String,FieldRegister)`` from the record's ``fieldHashPrefix(_:)``.
    static func hash(fieldsOf prefix: StableHasher, _ field: String, _ register: FieldRegister) -> (UInt64, UInt64) {
        var h = prefix
        h.combine(field)
        register.value.feed(into: &h)
        h.combine(register.timestamp.rawValue)
        h.combine(register.dot)
        h.combine(register.supersedes.rawValue)
        return h.finalize()
    }

    static func hash(_ key: RecordKey, _ replica: ReplicaID, _ entry: PresenceEntry) -> (UInt64, UInt64) {
        hash(presenceOf: presenceHashPrefix(key), replica, entry)
    }

    /// The hasher after the part every presence element of record `key` starts with.
    static func presenceHashPrefix(_ key: RecordKey) -> StableHasher {
        var h = StableHasher()
        h.combine(UInt8(2))
        h.combine(key.collection)
        h.combine(key.id)
        return h
    }

    /// ``hash(_:_:_:)-(RecordKey,ReplicaID,PresenceEntry)`` from the record's ``presenceHashPrefix(_:)``.
    static func hash(presenceOf prefix: StableHasher, _ replica: ReplicaID, _ entry: PresenceEntry) -> (UInt64, UInt64) {
        var h = prefix
        h.combine(replica)
        h.combine(entry.counter)
        if let removedBy = entry.removedBy {
            h.combine(UInt8(1))
            h.combine(removedBy)
        } else {
            h.combine(UInt8(0))
        }
        return h.finalize()
    }

    /// One replica's part of the context: its vector entry and cloud dots, as one element.
    static func contextHash(_ context: CausalContext, _ replica: ReplicaID) -> (UInt64, UInt64) {
        var sum = StateDigest()
        context.forEachEntry(of: replica) { counter, inCloud in sum.add(contextEntryHash(replica, counter, inCloud: inCloud)) }
        return (sum.high, sum.low)
    }

    /// One replica's cloud dots, as one element (the maintained digest's part of the context).
    static func cloudHash(_ context: CausalContext, _ replica: ReplicaID) -> (UInt64, UInt64) {
        var sum = StateDigest()
        if let cloud = context.dotCloud[replica] {
            for counter in cloud { sum.add(contextEntryHash(replica, counter, inCloud: true)) }
        }
        return (sum.high, sum.low)
    }

    /// One entry of the context: a version vector entry (kind 3) or a cloud dot (kind 4).
    static func contextEntryHash(_ replica: ReplicaID, _ counter: UInt64, inCloud: Bool) -> (UInt64, UInt64) {
        var h = StableHasher()
        h.combine(UInt8(inCloud ? 4 : 3))
        h.combine(replica)
        h.combine(counter)
        return h.finalize()
    }
}

extension StableHasher {
    mutating func combine(_ id: UUID) {
        withUnsafeBytes(of: id.uuid) { raw in
            combine(raw.loadUnaligned(fromByteOffset: 0, as: UInt64.self))
            combine(raw.loadUnaligned(fromByteOffset: 8, as: UInt64.self))
        }
    }

    mutating func combine(_ replica: ReplicaID) {
        combine(replica.high)
        combine(replica.low)
    }

    mutating func combine(_ dot: Dot) {
        combine(dot.replica)
        combine(dot.counter)
    }
}
