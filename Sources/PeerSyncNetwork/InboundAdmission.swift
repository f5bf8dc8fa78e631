import PeerSyncReplication
/// Which inbound TCP connections a node takes, with no sockets and no clock: at most
/// ``SyncLimits/inboundConnections`` open at once, and at most
/// ``SyncLimits/inboundConnectionsPerAddress`` from one remote IP address.
///
/// The shell asks ``arrived(from:now:)`` as soon as a connection is accepted — before any TLS
/// work — and closes it at once if refused; it reports ``closed(from:)`` when an admitted one
/// closes. Refusals are counted for status, and reported for one log line at most once per
/// ``reportInterval``, carrying the refusals since the previous report (a flood of connections
/// makes one line every 10 s, not one per connection).
struct InboundAdmission {
    /// Why a connection was refused.
    enum Refusal: Equatable {
        /// ``SyncLimits/inboundConnections`` connections were open.
        case total
        /// ``SyncLimits/inboundConnectionsPerAddress`` connections from its address were open.
        case perAddress
    }

    /// Refusals to log: counts since the previous report.
    struct Report: Equatable {
        var overTotal = 0
        var overAddress = 0
        /// The address of the latest refused connection.
        var lastAddress = ""
    }

    /// The shortest time between two reports.
    static let reportInterval: Duration = .seconds(10)

    let total: Int
    let perAddress: Int
    /// Admitted connections open now, by remote address.
    private(set) var open: [String: Int] = [:]
    private(set) var openCount = 0
    /// Every refusal so far.
    private(set) var refusedOverTotal = 0
    private(set) var refusedOverAddress = 0
    private var unreported = Report()
    private var lastReport: MonotonicInstant?

    init(limits: SyncLimits) {
        total = max(1, limits.inboundConnections)
        perAddress = max(1, limits.inboundConnectionsPerAddress)
    }

    /// A connection from `address` was accepted at `now`: whether to keep it, and a report to
    /// log if one is due.
    mutating func arrived(from address: String, now: MonotonicInstant) -> (refusal: Refusal?, report: Report?) {
        let refusal: Refusal? = if openCount >= total { .total } else if open[address, default: 0] >= perAddress { .perAddress } else { nil }
        guard let refusal else {
            open[address, default: 0] += 1
            openCount += 1
            return (nil, nil)
        }
        switch refusal {
        case .total:
            refusedOverTotal += 1
            unreported.overTotal += 1
        case .perAddress:
            refusedOverAddress += 1
            unreported.overAddress += 1
        }
        unreported.lastAddress = address
        if let last = lastReport, now - last < Self.reportInterval { return (refusal, nil) }
        lastReport = now
        defer { unreported = Report() }
        return (refusal, unreported)
    }

    /// An admitted connection from `address` closed.
    mutating func closed(from address: String) {
        guard let count = open[address], count > 0 else { return }
        open[address] = count == 1 ? nil : count - 1
        openCount -= 1
    }
}
