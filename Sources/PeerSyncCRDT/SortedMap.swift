/// A small map kept as one array sorted by key: the fields of one record (by name) and its
/// presence entries (by replica).
///
/// A record has a handful of fields and one presence entry per replica that wrote it, and
/// the engine holds 10⁴–10⁵ records. Against a `Dictionary` per record this costs one
/// allocation instead of a hash table, looks a name up without hashing it, copies as one
/// block when a shared record changes, and iterates in key order — the order every encoding
/// writes, so nothing sorts on the way out.
///
/// Invariant: keys strictly ascending (hence unique). Two maps with the same entries are equal
/// and hash equally whatever order the entries were added in, like a `Dictionary`.
///
/// Iteration yields `(key:value:)` pairs in ascending key order; the subscript by key reads,
/// replaces, inserts and (assigning `nil`) removes as a `Dictionary`'s does.
///
/// Public only to the modules of this package that import it as `@_spi(Engine)` (never to an
/// app: SPI is left out of the symbol graph and the API budget), not `package`: the compiler
/// specializes a generic type's inlinable code in another module only if it is public, and as
/// `package` every read of a record's fields from the wire and replication modules went through
/// unspecialized generic code (initial sync of 100k records 2.2× slower, issue 30).
@_spi(Engine) public struct SortedMap<Key: Comparable & Hashable & Sendable, Value: Hashable & Sendable>: Hashable, Sendable {
    /// One entry of the map's storage.
    public struct Entry: Hashable, Sendable {
        public var key: Key
        public var value: Value

        @inlinable init(key: Key, value: Value) {
            self.key = key
            self.value = value
        }
    }

    @usableFromInline var entries: [Entry]

    /// An empty map.
    @inlinable public init() { entries = [] }

    /// The entries of `dictionary`, in key order.
    @inlinable public init(_ dictionary: [Key: Value]) {
        entries = dictionary.map { Entry(key: $0.key, value: $0.value) }
        entries.sort { $0.key < $1.key }
    }

    /// Up to this many entries, a lookup compares keys one by one; beyond, it bisects.
    @usableFromInline static var linearLimit: Int { 12 }

    /// Where `key` is, or where it would go to keep the keys ascending.
    @inlinable
    func position(of key: Key) -> (index: Int, found: Bool) {
        let count = entries.count
        // Most writes and decodes arrive in key order: one comparison with the last key.
        if count == 0 || entries[count - 1].key < key { return (count, false) }
        if count <= Self.linearLimit {
            for i in 0..<count {
                let k = entries[i].key
                if k == key { return (i, true) }
                if key < k { return (i, false) }
            }
            return (count, false)
        }
        var low = 0
        var high = count
        while low < high {
            let mid = (low &+ high) / 2
            if entries[mid].key < key { low = mid &+ 1 } else { high = mid }
        }
        return (low, low < count && entries[low].key == key)
    }

    /// The value for `key`, or nil; assigning nil removes the entry.
    @inlinable
    public subscript(key: Key) -> Value? {
        get {
            let count = entries.count
            if count <= Self.linearLimit {
                // Equality only: for short string keys it is one word compare.
                for i in 0..<count where entries[i].key == key { return entries[i].value }
                return nil
            }
            let (index, found) = position(of: key)
            return found ? entries[index].value : nil
        }
        set {
            let (index, found) = position(of: key)
            switch (found, newValue) {
            case (true, let value?): entries[index].value = value
            case (true, nil): entries.remove(at: index)
            case (false, let value?): entries.insert(Entry(key: key, value: value), at: index)
            case (false, nil): break
            }
        }
    }

    /// Sets `value` for `key` and returns the value it replaced, as `Dictionary.updateValue`.
    @inlinable
    @discardableResult
    public mutating func updateValue(_ value: Value, forKey key: Key) -> Value? {
        let (index, found) = position(of: key)
        if found {
            let old = entries[index].value
            entries[index].value = value
            return old
        }
        entries.insert(Entry(key: key, value: value), at: index)
        return nil
    }

    /// Removes `key`'s entry and returns its value, as `Dictionary.removeValue(forKey:)`.
    @inlinable
    @discardableResult
    public mutating func removeValue(forKey key: Key) -> Value? {
        let (index, found) = position(of: key)
        return found ? entries.remove(at: index).value : nil
    }

    /// Reserves room for `capacity` entries.
    @inlinable public mutating func reserveCapacity(_ capacity: Int) { entries.reserveCapacity(capacity) }

    /// The keys, ascending.
    @inlinable
    public var keys: LazyMapCollection<[Entry], Key> { entries.lazy.map { $0.key } }

    /// The values, in the order of their keys.
    ///
    @inlinable
    public var values: LazyMapCollection<[Entry], Value> { entries.lazy.map { $0.value } }

    /// The same keys with `transform` applied to each value.
    @inlinable
    public func mapValues<T>(_ transform: (Value) throws -> T) rethrows -> SortedMap<Key, T> {
        var result = SortedMap<Key, T>()
        result.entries = try entries.map { .init(key: $0.key, value: try transform($0.value)) }
        return result
    }

    /// The entries as a `Dictionary`.
    @inlinable
    public var dictionary: [Key: Value] {
        Dictionary(uniqueKeysWithValues: entries.lazy.map { ($0.key, $0.value) })
    }
}

extension SortedMap: RandomAccessCollection {
    public typealias Element = (key: Key, value: Value)
    public typealias Index = Int
    public typealias Indices = Range<Int>

    @inlinable public var startIndex: Int { 0 }
    @inlinable public var endIndex: Int { entries.count }
    @inlinable public var count: Int { entries.count }
    @inlinable public var isEmpty: Bool { entries.isEmpty }

    @inlinable
    public subscript(position: Int) -> (key: Key, value: Value) {
        let entry = entries[position]
        return (entry.key, entry.value)
    }
}

extension SortedMap: ExpressibleByDictionaryLiteral {
    /// A map from a literal; a key given twice is a programming error, as in a `Dictionary`.
    @inlinable
    public init(dictionaryLiteral elements: (Key, Value)...) {
        // `[:]` (every empty record part) must not cost a generic sort.
        if elements.isEmpty {
            entries = []
            return
        }
        entries = elements.map { Entry(key: $0.0, value: $0.1) }
        entries.sort { $0.key < $1.key }
        for i in entries.indices.dropFirst() {
            precondition(entries[i - 1].key != entries[i].key, "SortedMap literal with the key \(entries[i].key) twice")
        }
    }
}

extension SortedMap: CustomStringConvertible {
    public var description: String {
        "[" + entries.map { "\($0.key): \($0.value)" }.joined(separator: ", ") + "]"
    }
}
