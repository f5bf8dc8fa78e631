@_spi(Engine) import PeerSyncCRDT

/// One concurrent overwrite: which value won a field, which lost, and when it was noticed.
package struct ConflictEntry: Hashable, Sendable {
    public let key: RecordKey
    public let field: String
    public let winner: FieldRegister
    public let loser: FieldRegister
    /// The local clock when the conflict was detected.
    public let detectedAt: HLCTimestamp

    public init(key: RecordKey, field: String, winner: FieldRegister, loser: FieldRegister, detectedAt: HLCTimestamp) {
        self.key = key
        self.field = field
        self.winner = winner
        self.loser = loser
        self.detectedAt = detectedAt
    }
}

/// The last `capacity` conflicts, oldest first. Local to a replica (not synced): each replica
/// records the losers it saw replaced or rejected — pairs where one of its joins held one value
/// and received the other. The writer of the losing value sees the pair; the winner's
/// replica sees it only if the losing value reaches it before being overwritten (anti-entropy
/// sends current values only; docs/ARCHITECTURE.md, "Conflicts"). A loser is recorded once.
package struct ConflictLog: Sendable, Equatable {
    public static let defaultCapacity = 1000

    public let capacity: Int
    public private(set) var entries: [ConflictEntry] = []
    /// How many entries were ever added (the store persists the ones added since it last looked).
    public private(set) var totalRecorded = 0
    /// (record, field, loser's dot) of every entry, for O(1) duplicate checks.
    private var logged: Set<LoserID> = []

    private struct LoserID: Hashable, Sendable {
        let key: RecordKey
        let field: String
        let dot: Dot
        init(_ entry: ConflictEntry) {
            key = entry.key
            field = entry.field
            dot = entry.loser.dot
        }
    }

    public init(capacity: Int = ConflictLog.defaultCapacity, entries: [ConflictEntry] = []) {
        precondition(capacity > 0)
        self.capacity = capacity
        self.entries = Array(entries.suffix(capacity))
        logged = Set(self.entries.map(LoserID.init))
    }

    /// Appends `entry` unless the same loser of the same field is already logged.
    /// Returns whether it was added.
    ///
    /// - Complexity: O(1) amortized.
    @discardableResult
    public mutating func record(_ entry: ConflictEntry) -> Bool {
        guard logged.insert(LoserID(entry)).inserted else { return false }
        entries.append(entry)
        totalRecorded += 1
        if entries.count > capacity {
            for dropped in entries.prefix(entries.count - capacity) { logged.remove(LoserID(dropped)) }
            entries.removeFirst(entries.count - capacity)
        }
        return true
    }

    public static func == (lhs: ConflictLog, rhs: ConflictLog) -> Bool {
        lhs.capacity == rhs.capacity && lhs.entries == rhs.entries && lhs.totalRecorded == rhs.totalRecorded
    }
}
