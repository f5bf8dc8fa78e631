/// The per-record step of ``RecordMap/apply(_:)``: joins one incoming record state into the
/// one held (or into nothing), keeping the digest and the dot index current and noting what
/// changed. The digest counts visible records only (``RecordMap/digest``): a record's elements
/// move with it one by one while it stays visible, and all at once when it is deleted or revived. It works on the record in its collection's dictionary, in place, so a join costs
/// one lookup by record ID however many fields change.
struct RecordJoin {
    /// The context before the join (an incoming loser the receiver never saw is a conflict).
    let seenBefore: CausalContext
    var digest: StateDigest?
    var index: DotIndex?

    /// The dot index's slot for `collection` (nil without an index or when slots ran out).
    mutating func slot(of collection: String) -> UInt16? {
        index?.slot(of: collection)
    }

    mutating func record(_ key: RecordKey, slot: UInt16?, _ incoming: RecordState,
                         into held: inout RecordState?, _ outcome: inout MergeOutcome) {
        if incoming.isEmpty { return }
        guard var current = held else {
            insert(key, slot: slot, incoming, &outcome)
            held = incoming
            return
        }
        held = nil  // `current` is now the only reference: its dictionaries change in place
        // The digest's elements of one record share a prefix (kind, collection, ID): hashed once.
        var prefix: StableHasher?
        func fieldHash(_ name: String, _ register: FieldRegister) -> (UInt64, UInt64) {
            if prefix == nil { prefix = RecordMap.fieldHashPrefix(key) }
            return RecordMap.hash(fieldsOf: prefix!, name, register)
        }
        var presencePrefix: StableHasher?
        func presenceHash(_ replica: ReplicaID, _ entry: PresenceEntry) -> (UInt64, UInt64) {
            if presencePrefix == nil { presencePrefix = RecordMap.presenceHashPrefix(key) }
            return RecordMap.hash(presenceOf: presencePrefix!, replica, entry)
        }
        var recordChanged = false
        var presenceChanged = false
        let visibilityBefore = current.isVisible
        // Element by element only while the record is in the digest (it was visible); a
        // deleted record's elements are not, and a change of visibility moves them all below.
        let tracking = visibilityBefore && digest != nil
        // The fields of one write share its dot: index it once, not once per field.
        var lastIndexed: Dot?
        func indexDot(_ dot: Dot) {
            if dot != lastIndexed, let slot { index?.add(dot, id: key.id, slot: slot) }
            lastIndexed = dot
        }
        for (name, theirs) in incoming.fields {
            // One search finds the field or where it goes.
            let (position, found) = current.fields.position(of: name)
            if found {
                let ours = current.fields.entries[position].value
                if ours == theirs { continue }
                if theirs.wins(over: ours) {
                    if tracking {
                        digest!.remove(fieldHash(name, ours))
                        digest!.add(fieldHash(name, theirs))
                    }
                    current.fields.entries[position].value = theirs
                    indexDot(theirs.dot)
                    outcome.changedFieldCount += 1
                    recordChanged = true
                    if theirs.supersedes < ours.timestamp, theirs.value != ours.value {
                        outcome.conflicts.append(FieldConflict(key: key, field: name, winner: theirs, loser: ours))
                    }
                } else if !seenBefore.contains(theirs.dot), ours.supersedes < theirs.timestamp, theirs.value != ours.value {
                    outcome.conflicts.append(FieldConflict(key: key, field: name, winner: ours, loser: theirs))
                }
            } else {
                if tracking { digest!.add(fieldHash(name, theirs)) }
                current.fields.entries.insert(.init(key: name, value: theirs), at: position)
                indexDot(theirs.dot)
                outcome.changedFieldCount += 1
                recordChanged = true
            }
            outcome.maxTimestamp.merge(theirs.timestamp)
        }
        for (replica, theirs) in incoming.presence {
            let ours = current.presence[replica]
            let joined = ours.map { $0.joined(with: theirs) } ?? theirs
            if joined != ours {
                if tracking {
                    if let ours { digest!.remove(presenceHash(replica, ours)) }
                    digest!.add(presenceHash(replica, joined))
                }
                current.presence[replica] = joined
                // A write's presence entry has the dot of its fields, indexed above already.
                indexDot(Dot(replica: replica, counter: joined.counter))
                if let remover = joined.removedBy { indexDot(remover) }
                outcome.changedPresenceCount += 1
                presenceChanged = true
            }
        }
        let visibilityAfter = current.isVisible
        if digest != nil, visibilityBefore != visibilityAfter {
            // Deleted: its (already updated) elements leave the digest; revived: they enter it.
            for (name, register) in current.fields {
                if visibilityAfter { digest!.add(fieldHash(name, register)) } else { digest!.remove(fieldHash(name, register)) }
            }
            for (replica, entry) in current.presence {
                if visibilityAfter { digest!.add(presenceHash(replica, entry)) } else { digest!.remove(presenceHash(replica, entry)) }
            }
        }
        if recordChanged || visibilityBefore != visibilityAfter {
            outcome.changedRecords.insert(key)
        } else if presenceChanged {
            outcome.presenceOnlyChanges.insert(key)
        }
        held = current.isEmpty ? nil : current
    }

    /// A record not held: the join is the incoming record itself (no element to compare, no
    /// conflict), taken whole instead of field by field.
    private mutating func insert(_ key: RecordKey, slot: UInt16?, _ incoming: RecordState, _ outcome: inout MergeOutcome) {
        if digest != nil, incoming.isVisible {
            let prefix = RecordMap.fieldHashPrefix(key)
            for (name, register) in incoming.fields { digest!.add(RecordMap.hash(fieldsOf: prefix, name, register)) }
            let presencePrefix = RecordMap.presenceHashPrefix(key)
            for (replica, entry) in incoming.presence { digest!.add(RecordMap.hash(presenceOf: presencePrefix, replica, entry)) }
        }
        for register in incoming.fields.values { outcome.maxTimestamp.merge(register.timestamp) }
        outcome.changedFieldCount += incoming.fields.count
        outcome.changedPresenceCount += incoming.presence.count
        if !incoming.fields.isEmpty || incoming.isVisible { outcome.changedRecords.insert(key) } else { outcome.presenceOnlyChanges.insert(key) }
        if let slot { index?.addNew(incoming, id: key.id, slot: slot) }
    }
}

extension RecordMap {
    /// The records of `delta` that ``isPurgedEcho(_:_:)`` drops (only a compacted state has any).
    func purgedEchoes(in delta: RecordMap) -> Set<RecordKey> {
        var echoes: Set<RecordKey> = []
        for (collection, records) in delta.collections {
            for (id, incoming) in records {
                let key = RecordKey(collection: collection, id: id)
                if isPurgedEcho(key, incoming) { echoes.insert(key) }
            }
        }
        return echoes
    }
}
