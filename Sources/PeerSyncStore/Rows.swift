import GRDB
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel

/// The `replica` table's single row.
struct ReplicaRow: Codable, FetchableRecord, PersistableRecord {
    static let databaseTableName = "replica"
    enum Columns {
        static let clock = Column(CodingKeys.clock)
        static let context = Column(CodingKeys.context)
        static let name = Column(CodingKeys.name)
    }

    var singleton = 1
    var replicaID: String
    var name: String
    var createdAt: Int64
    /// Largest hybrid timestamp issued or observed (bit pattern of the UInt64).
    var clock: Int64
    var context: Data
    /// Machine and file identity the store was last opened under (nil before it was recorded).
    var binding: String?
    var groupID: Data?
    var joinInviter: Data?
    var joinEntry: Data?
}

/// One record: its CRDT state as a blob, and whether it is visible (for counting in SQL).
struct RecordRow: Codable, FetchableRecord, PersistableRecord {
    static let databaseTableName = "record"
    enum Columns {
        static let collection = Column(CodingKeys.collection)
        static let visible = Column(CodingKeys.visible)
    }

    var collection: String
    var id: Data
    var visible: Bool
    var state: Data
}

struct LocalSettingRow: Codable, FetchableRecord, PersistableRecord {
    static let databaseTableName = "localSetting"
    var key: String
    var value: Data
}

/// One conflict: `registers` is a blob of a record state whose fields `w` and `l` are the
/// winner and the loser (reusing the record encoding).
struct ConflictRow: Codable, FetchableRecord, MutablePersistableRecord {
    static let databaseTableName = "conflict"
    enum Columns { static let seq = Column(CodingKeys.seq) }

    var seq: Int64?
    var collection: String
    var recordID: Data
    var field: String
    var registers: Data
    var detectedAt: Int64
    /// The writers' names, filled in when the replica first resolves them (v7).
    var winnerName: String?
    var loserName: String?

    init(_ entry: ConflictEntry) {
        collection = entry.key.collection
        recordID = entry.key.id.data
        field = entry.field
        registers = Data(RecordState(fields: ["w": entry.winner, "l": entry.loser]).encodedBlob())
        detectedAt = Int64(bitPattern: entry.detectedAt.rawValue)
    }

    mutating func didInsert(_ inserted: InsertionSuccess) {
        seq = inserted.rowID
    }

    func entry() throws -> ConflictEntry {
        let state = try RecordState(blob: Array(registers))
        guard let winner = state.fields["w"], let loser = state.fields["l"], let id = UUID(data: recordID) else {
            throw BinaryDecodingError.invalid("conflict row \(seq ?? 0)")
        }
        return ConflictEntry(key: RecordKey(collection: collection, id: id), field: field, winner: winner,
                             loser: loser, detectedAt: HLCTimestamp(rawValue: UInt64(bitPattern: detectedAt)))
    }
}

/// One committed transaction. `delta` is nil when it was too large to keep (a big catch-up):
/// readers then reload the whole state.
struct JournalRow: Codable, FetchableRecord, MutablePersistableRecord {
    static let databaseTableName = "journal"
    enum Columns {
        static let seq = Column(CodingKeys.seq)
    }

    var seq: Int64?
    var committedAt: Int64
    var origin: String
    var summary: String
    var delta: Data?
    /// For a commit with local events: their dots (a context blob). Compaction may drop `delta`
    /// but keeps this (migration v6).
    var events: Data? = nil

    mutating func didInsert(_ inserted: InsertionSuccess) {
        seq = inserted.rowID
    }
}

extension UUID {
    var data: Data { withUnsafeBytes(of: uuid) { Data($0) } }

    /// `ids` in the order SQLite gives ``data`` as a BLOB (bytewise, as `memcmp`); each ID's
    /// words are computed once.
    static func sortedInBlobOrder(_ ids: [UUID]) -> [UUID] {
        ids.map { ($0.bigEndianWords, $0) }.sorted { $0.0 < $1.0 }.map(\.1)
    }

    /// The 16 bytes as two big-endian words: comparing them compares the bytes in order.
    private var bigEndianWords: (UInt64, UInt64) {
        withUnsafeBytes(of: uuid) { raw in
            (UInt64(bigEndian: raw.loadUnaligned(fromByteOffset: 0, as: UInt64.self)),
             UInt64(bigEndian: raw.loadUnaligned(fromByteOffset: 8, as: UInt64.self)))
        }
    }

    init?(data: Data) {
        guard data.count == 16 else { return nil }
        let b = Array(data)
        self.init(uuid: (b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]))
    }
}

extension RecordKey {
    /// Collection names in the order of the `record` table's primary key `(collection, id)`:
    /// as SQLite's BINARY collation compares them (UTF-8 bytes). IDs follow
    /// ``Foundation/UUID/sortedInBlobOrder(_:)``.
    static func precedesInTableOrder(_ a: String, _ b: String) -> Bool {
        a.utf8.lexicographicallyPrecedes(b.utf8)
    }
}
