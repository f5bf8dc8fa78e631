@_spi(Engine) import PeerSyncCRDT

/// A device's decisions about one relay (pure): what to upload, what the relay has confirmed,
/// and whether it withholds something it was shown to hold (docs/PROTOCOL.md §20.5). Fed with
/// what the session sees; asked with what the device holds; no clocks of its own (`now` is
/// given, monotonic).
package struct RelayLedger: Sendable {
    /// Per replica, the counters the relay covers from 1 without a gap, as far as this device
    /// knows (its welcome, the blobs it sent, its "stored" answers).
    public private(set) var relayHolds: [ReplicaID: UInt64] = [:]
    /// Per replica, the highest counter uploaded and not yet confirmed.
    public private(set) var uploaded: [ReplicaID: UInt64] = [:]
    /// Per replica, the highest head a blob from this relay claimed (its writer held that much).
    public private(set) var heads: [ReplicaID: UInt64] = [:]
    /// The relay has answered the device's want (everything it holds was sent).
    public private(set) var caughtUp = false
    /// Gaps seen, by replica: the counters missing and since when.
    private var gaps: [ReplicaID: (range: ClosedRange<UInt64>, since: Duration)] = [:]

    package init() {}

    /// A gap the relay has not filled within the bound: it shows blobs up to `head` of
    /// `replica` but not `missing`.
    package struct Withheld: Sendable, Equatable, CustomStringConvertible {
        public let replica: ReplicaID
        public let missing: ClosedRange<UInt64>
        public var description: String {
            "writer \(replica.shortDescription)'s counters \(missing.lowerBound)–\(missing.upperBound)"
        }
    }

    package mutating func welcomed(covered: [ReplicaID: UInt64]) {
        relayHolds = covered
        uploaded = [:]
        caughtUp = false
    }

    /// Where each upload should start: replicas whose contiguous counter here passes what the
    /// relay holds and what is in flight (`held`: this device's version vector).
    package func uploads(held: [ReplicaID: UInt64]) -> [(replica: ReplicaID, after: UInt64)] {
        held.compactMap { replica, counter in
            let after = max(relayHolds[replica, default: 0], uploaded[replica, default: 0])
            return counter > after ? (replica, after) : nil
        }.sorted { $0.replica.bigEndianBytes.lexicographicallyPrecedes($1.replica.bigEndianBytes) }
    }

    package mutating func uploading(_ replica: ReplicaID, through last: UInt64) {
        uploaded[replica] = max(uploaded[replica, default: 0], last)
    }

    /// The relay stored an upload of `replica` through `last`.
    package mutating func stored(_ replica: ReplicaID, through last: UInt64) {
        relayHolds[replica] = max(relayHolds[replica, default: 0], last)
        if uploaded[replica, default: 0] <= last { uploaded[replica] = nil }
    }

    /// An upload was refused (quota): it is not in flight any more; it is tried again later.
    package mutating func refusedUploads() { uploaded = [:] }

    /// A blob arrived from the relay.
    package mutating func received(replica: ReplicaID, first: UInt64, last: UInt64, head: UInt64, covers: [ReplicaID: UInt64]) {
        for (covered, counter) in covers { relayHolds[covered] = max(relayHolds[covered, default: 0], counter) }
        if covers.isEmpty, first <= relayHolds[replica, default: 0] + 1 {
            relayHolds[replica] = max(relayHolds[replica, default: 0], last)
        }
        heads[replica] = max(heads[replica, default: 0], head)
    }

    package mutating func answeredWant() { caughtUp = true }

    /// Gaps between what the relay's blobs claim (their heads) and what this device holds
    /// (`held`, contiguous per replica) that have lasted `bound` or more at `now`. Checked
    /// only once the relay has answered the want (before, blobs are still arriving).
    package mutating func withheld(held: [ReplicaID: UInt64], now: Duration, bound: Duration) -> [Withheld] {
        guard caughtUp else { return [] }
        var found: [Withheld] = []
        for (replica, head) in heads {
            let have = held[replica, default: 0]
            guard head > have else {
                gaps[replica] = nil
                continue
            }
            let range = (have + 1)...head
            if let gap = gaps[replica], gap.range.lowerBound == range.lowerBound {
                gaps[replica] = (range, gap.since)
                if now - gap.since >= bound { found.append(Withheld(replica: replica, missing: range)) }
            } else {
                gaps[replica] = (range, now)
                if bound <= .zero { found.append(Withheld(replica: replica, missing: range)) }
            }
        }
        return found.sorted { $0.replica.bigEndianBytes.lexicographicallyPrecedes($1.replica.bigEndianBytes) }
    }
}
