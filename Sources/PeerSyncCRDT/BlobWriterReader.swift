import Foundation

// The writer and reader of the blob layout described in BinaryCoding.swift: a replica table,
// then a body that refers to replicas by their index in it.

/// Assigns table indices to replica IDs in order of first use.
struct ReplicaTableBuilder {
    private(set) var ids: [ReplicaID] = []
    private var index: [ReplicaID: UInt64] = [:]

    mutating func index(of id: ReplicaID) -> UInt64 {
        // A record's blob names one or two replicas: a scan beats hashing them. The dictionary
        // takes over for long tables (contexts, whole states).
        if ids.count <= Self.scanLimit {
            if let i = ids.firstIndex(of: id) { return UInt64(i) }
        } else if let i = index[id] {
            return i
        }
        let i = UInt64(ids.count)
        ids.append(id)
        if ids.count == Self.scanLimit + 1 {
            for (j, known) in ids.enumerated() { index[known] = UInt64(j) }
        } else if ids.count > Self.scanLimit + 1 {
            index[id] = i
        }
        return i
    }

    private static let scanLimit = 8
}

struct BlobWriter {
    var body: [UInt8] = []
    var table = ReplicaTableBuilder()

    init() { body.reserveCapacity(128) }

    /// A writer whose replica table is known in advance (`ids`, in order of use), written at
    /// the start of `body`; ``finishWithTableFirst()`` then returns the blob without a copy.
    init(table ids: [ReplicaID], bodyCapacity: Int) {
        body.reserveCapacity(1 + ids.count * 16 + bodyCapacity)
        Varint.append(UInt64(ids.count), to: &body)
        for id in ids {
            _ = table.index(of: id)
            id.appendBigEndianBytes(to: &body)
        }
        tableFirst = ids.count
    }

    private var tableFirst: Int?

    /// The blob of a writer made with ``init(table:bodyCapacity:)``.
    func finishWithTableFirst() -> [UInt8] {
        precondition(tableFirst == table.ids.count, "a replica outside the table given in advance")
        return body
    }

    mutating func replica(_ id: ReplicaID) {
        Varint.append(table.index(of: id), to: &body)
    }

    mutating func varint(_ v: UInt64) { Varint.append(v, to: &body) }

    mutating func string(_ s: String) {
        Varint.append(UInt64(s.utf8.count), to: &body)
        body.append(contentsOf: s.utf8)
    }

    mutating func uuid(_ id: UUID) {
        withUnsafeBytes(of: id.uuid) { body.append(contentsOf: $0) }
    }

    func finish(prefix: [UInt8] = []) -> [UInt8] {
        var out = prefix
        out.reserveCapacity(prefix.count + 1 + table.ids.count * 16 + body.count)
        Varint.append(UInt64(table.ids.count), to: &out)
        for id in table.ids { id.appendBigEndianBytes(to: &out) }
        out.append(contentsOf: body)
        return out
    }
}

struct BlobReader {
    var reader: ByteReader
    let table: [ReplicaID]

    /// Reads the replica table; `maxTable` bounds it before any ID is read (a context blob's
    /// table names the context's replicas, so at most ``ValidationLimits/maxContextReplicas``;
    /// other blobs are bounded by their bytes only).
    init(_ bytes: [UInt8], skipping prefix: Int = 0, maxTable: Int = .max) throws(BinaryDecodingError) {
        reader = ByteReader(bytes)
        guard reader.readBytes(prefix) != nil else { throw .truncated("header") }
        guard let count = reader.readVarint(), count <= UInt64(reader.remaining / 16) else {
            throw .truncated("replica table")
        }
        guard count <= UInt64(maxTable) else {
            throw .invalid("replica table of \(count) IDs (limit \(maxTable))")
        }
        var table: [ReplicaID] = []
        table.reserveCapacity(Int(count))
        for _ in 0..<count { table.append(ReplicaID(bigEndianBytes: reader.readBytes(16)!)!) }
        guard Set(table).count == table.count else { throw .invalid("replica table (duplicate ID)") }
        self.table = table
    }

    // `what` names the item in an error; it is an autoclosure so that the names (often
    // interpolated) cost nothing unless decoding fails.

    mutating func varint(_ what: @autoclosure () -> String) throws(BinaryDecodingError) -> UInt64 {
        guard let v = reader.readVarint() else { throw .truncated(what()) }
        return v
    }

    /// A count of items that each take at least one byte.
    mutating func count(_ what: @autoclosure () -> String) throws(BinaryDecodingError) -> Int {
        let n = try varint(what())
        guard n <= UInt64(reader.remaining) else { throw .truncated(what()) }
        return Int(n)
    }

    mutating func replica(_ what: @autoclosure () -> String) throws(BinaryDecodingError) -> ReplicaID {
        let i = try varint(what())
        guard i < UInt64(table.count) else { throw .invalid("\(what()) (replica index \(i) of \(table.count))") }
        return table[Int(i)]
    }

    /// An event counter: 1 through ``ValidationLimits/maxCounter``.
    mutating func counter(_ what: @autoclosure () -> String) throws(BinaryDecodingError) -> UInt64 {
        let c = try varint(what())
        guard ValidationLimits.isValidCounter(c) else {
            throw .invalid("\(what()) (counter \(c) outside 1...\(ValidationLimits.maxCounter))")
        }
        return c
    }

    mutating func string(_ what: @autoclosure () -> String) throws(BinaryDecodingError) -> String {
        guard let bytes = reader.readLengthPrefixed() else { throw .truncated(what()) }
        guard let s = String(validating: bytes, as: UTF8.self) else { throw .invalid("\(what()) (not UTF-8)") }
        return s
    }

    mutating func uuid(_ what: @autoclosure () -> String) throws(BinaryDecodingError) -> UUID {
        guard let b = reader.readBytes(16) else { throw .truncated(what()) }
        let a = Array(b)
        return UUID(uuid: (a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15]))
    }

    mutating func value(_ what: @autoclosure () -> String) throws(BinaryDecodingError) -> FieldValue {
        do {
            return try FieldValue.decode(from: &reader, depth: 0)
        } catch {
            throw .invalid("\(what()): \(error)")
        }
    }

    func expectEnd(_ what: String) throws(BinaryDecodingError) {
        guard reader.isAtEnd else { throw .invalid("\(what) (\(reader.remaining) trailing bytes)") }
    }
}
