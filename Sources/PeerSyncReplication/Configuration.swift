@_spi(Engine) import PeerSyncCRDT
import PeerSyncWire

/// A TCP endpoint: a host name or IP address and a port.
///
/// The one type for "where a peer is" and "where to listen" in PeerSync's API.
public struct PeerAddress: Hashable, Sendable, CustomStringConvertible {
    public var host: String
    public var port: UInt16

    public init(host: String, port: UInt16) {
        self.host = host
        self.port = port
    }

    /// Parses `host:port`, `[ipv6]:port`, or `host` alone when `defaultPort` is given.
    ///
    /// - Throws: ``AddressError`` naming what is wrong with `text`.
    public init(parsing text: String, defaultPort: UInt16? = nil) throws(AddressError) {
        var host = Substring(text)
        var portText: Substring?
        if host.hasPrefix("[") {
            guard let close = host.firstIndex(of: "]") else { throw AddressError(text: text, problem: "missing ']'") }
            let rest = host[host.index(after: close)...]
            host = host[host.index(after: host.startIndex)..<close]
            if !rest.isEmpty {
                guard rest.first == ":" else { throw AddressError(text: text, problem: "expected ':' after ']'") }
                portText = rest.dropFirst()
            }
        } else if let colon = host.lastIndex(of: ":") {
            portText = host[host.index(after: colon)...]
            host = host[..<colon]
        }
        guard !host.isEmpty else { throw AddressError(text: text, problem: "no host") }
        if let portText {
            guard let port = UInt16(portText) else {
                throw AddressError(text: text, problem: "port '\(portText)' is not a number from 0 to 65535")
            }
            self.init(host: String(host), port: port)
        } else if let defaultPort {
            self.init(host: String(host), port: defaultPort)
        } else {
            throw AddressError(text: text, problem: "no port (write HOST:PORT)")
        }
    }

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }

    /// `127.0.0.1:port`.
    public static func loopback(_ port: UInt16) -> PeerAddress { PeerAddress(host: "127.0.0.1", port: port) }
}

/// An address that could not be parsed.
public struct AddressError: Error, Sendable, Equatable, CustomStringConvertible {
    public let text: String
    public let problem: String
    public var description: String { "invalid address '\(text)': \(problem)" }
}

/// Exponential backoff with jitter: `first`, doubling up to `max`, each delay scaled by a random
/// factor in `1 ± jitter`.
public struct Backoff: Sendable, Equatable {
    public var first: Duration
    public var max: Duration
    /// Relative jitter, 0...1 (0.2 = ±20 %).
    public var jitter: Double

    public init(first: Duration, max: Duration, jitter: Double = 0.2) {
        self.first = first
        self.max = max
        self.jitter = jitter
    }

    /// The delay before attempt `failures + 1`; `unit` is a random number in `-1...1`.
    public func delay(afterFailures failures: Int, unit: Double) -> Duration {
        var base = first
        for _ in 0..<Swift.max(0, Swift.min(failures, 62)) where base < max { base = Swift.min(base * 2, max) }
        let factor = 1 + jitter * Swift.min(1, Swift.max(-1, unit))
        return base * factor
    }
}

/// The timers of sync. Every duration runs on the monotonic clock; only the skew bound compares
/// wall clocks.
public struct SyncTiming: Sendable, Equatable {
    /// Peers whose wall clock differs by more are refused at hello; deltas stamped further ahead
    /// than this are refused.
    public var maxClockSkew: Duration = .seconds(300)
    /// A session that has sent nothing for this long sends a ping.
    public var keepaliveInterval: Duration = .seconds(1)
    /// A session that has received nothing for this long is closed (error reason 8).
    public var deadPeerTimeout: Duration = .seconds(5)
    /// After a change, a session quiet for this long exchanges an ack and a digest.
    public var digestQuietPeriod: Duration = .milliseconds(200)
    /// A connection is closed if its TLS handshake does not finish within this time, or if the
    /// hello, authentication and admission that follow do not finish within this time after it
    /// (a limit of ``SyncLimits``, kept here with the other timers).
    public var handshakeTimeout: Duration = .seconds(10)
    /// Redialing a static or discovered peer.
    public var reconnectBackoff = Backoff(first: .milliseconds(200), max: .seconds(5))
    /// How long a closing session may take to flush its goodbye or error before it is cut.
    public var closeDrainTimeout: Duration = .seconds(2)
    /// Period of the node's one shared timer.
    public var tick: Duration = .milliseconds(100)
    /// A live delta that follows the previous one to the same peer within this time waits until
    /// this long after it, so a stream of commits shares frames (and TLS records) instead of
    /// sending one per commit; a lone edit goes out at once. Zero sends every delta at once.
    public var deltaCoalescing: Duration = .milliseconds(2)
    /// A held stream goes as soon as this many live deltas wait, without waiting for the end of
    /// ``deltaCoalescing``: four share one TLS record, whose 22 bytes of header and tag are then
    /// 5.5 bytes per update, and the first of them waits only for the writer's next three
    /// commits. At most 16 counts (more waiting deltas are joined into one).
    public var deltaCoalescingCount = 4
    /// Records a catch-up round brought in from one peer are relayed to another peer (one not
    /// connected to their writers) this long after they are committed, as a catch-up round of
    /// what it still lacks — and not at all if by then it says it is connected to the writers
    /// (docs/PROTOCOL.md §6.6). When a partition heals, every session comes up within about
    /// this time; relaying at once sent each replica's changes twice.
    public var roundRelayDelay: Duration = .milliseconds(100)
    /// A catch-up round that has arrived whole waits up to this long, uncommitted, while another
    /// session is in the middle of one, so the two go into one transaction. When a partition
    /// heals every peer sends a round at once; committed one by one, each rewrote most of the
    /// store's pages (W3: a commit per round, ~700 WAL pages each). Zero commits each at once.
    public var roundCommitHold: Duration = .milliseconds(50)
    /// An attachment range request unanswered for this long is asked again (of another peer
    /// if there is one).
    public var attachmentRequestTimeout: Duration = .seconds(30)
    /// How long a relay may show a writer's head without the counters below it before the
    /// device reports that the relay withholds them (docs/RELAY.md).
    public var relayWithholdingBound: Duration = .seconds(30)

    public init() {}
}

/// Every resource bound of a node, with its default. docs/SECURITY.md ("Threat model and
/// limits") lists them; `peersync run` has an option for each.
///
/// One bound lives with the other timers: ``SyncTiming/handshakeTimeout`` (10 s for TLS, then
/// 10 s for hello, authentication and admission; a connection late for either is closed).
/// Counts below 1 are taken as 1.
public struct SyncLimits: Sendable, Equatable {
    /// Largest frame this node accepts (announced in its hello); at least 65,536.
    public var maxFrameBytes: Int = WireLimits.defaultMaxFrameBytes
    /// Catch-up chunks are cut below this size (and below the peer's announced frame limit).
    public var chunkTargetBytes: Int = WireLimits.chunkTargetBytes
    /// Consecutive catch-up chunks received are committed together up to this many bytes.
    public var catchUpBatchBytes: Int = 32 << 20
    /// Deltas queued for one peer beyond this many bytes are dropped and replaced by one
    /// catch-up round computed from what the peer is known to have.
    public var outboxDeltaBytes: Int = 8 << 20
    /// Established sessions at once; a hello beyond is refused (reason 9, overloaded).
    public var sessions: Int = 128
    /// Inbound TCP connections open at once, from every address together (handshaking or in a
    /// session). One more is closed as soon as it is accepted, before any TLS work.
    public var inboundConnections: Int = 256
    /// Inbound TCP connections open at once from one remote IP address; one more is closed as
    /// soon as it is accepted. A device needs one (two while a duplicate is resolved).
    public var inboundConnectionsPerAddress: Int = 16
    /// Connection attempts (connect, TLS, hello, authentication, admission) running at once, to
    /// static and discovered peers together. An established session no longer counts.
    public var concurrentDials: Int = 8
    /// Connection attempts running at once to one host, so adverts that all point at one
    /// machine take one attempt at a time however many there are.
    public var concurrentDialsPerHost: Int = 1
    /// Redialing an address whose session failed to authenticate or was refused (a TLS failure,
    /// no hello or admission within the handshake timeout, another group, a device not admitted
    /// or removed, another protocol version, clock skew): from 5 s, doubling up to 5 minutes.
    /// Other failures redial with ``SyncTiming/reconnectBackoff``.
    public var rejectedDialBackoff = Backoff(first: .seconds(5), max: .seconds(300))
    /// Attachment bytes asked for per request (also below the frame limits of both sides and
    /// ``AttachmentWireLimits/maxRangeBytes``).
    public var attachmentRangeBytes: Int = 1 << 20
    /// Attachment range reads a peer may have outstanding here; requests beyond are answered
    /// `attachmentUnavailable`.
    public var attachmentServesPerSession: Int = 8
    /// A relay's bytes stored per group (docs/RELAY.md): uploads beyond are refused, one line
    /// each, and nothing stored is lost.
    public var relayGroupBytes: Int = 256 << 20
    /// A relay's blobs stored per group.
    public var relayGroupBlobs: Int = 200_000
    /// A relay's connections per group at once.
    public var relayGroupConnections: Int = 64
    /// Groups one relay serves.
    public var relayGroups: Int = 1000
    /// Connections one relay holds at once (strangers included, until refused).
    public var relayConnections: Int = 4096
    /// Connections one relay holds at once from one IP address (many devices share one behind
    /// a NAT); more are closed on arrival, before any TLS work.
    public var relayConnectionsPerAddress: Int = 256

    public init() {}
}

/// How changes travel.
public enum TransferMode: Sendable, Equatable {
    /// Catch-up of exactly what the peer lacks, then deltas (the default).
    case deltas
    /// Every catch-up and every change ships the whole state: the classic state-based CRDT,
    /// kept as a switch on the same code path for benchmarks.
    case fullState
}

/// Everything that configures sync, for ``SyncNode`` and the engine alike.
public struct SyncConfiguration: Sendable {
    public var security: SessionSecurity
    /// Where to accept connections (port 0 picks a free one); nil accepts none.
    public var listen: PeerAddress?
    /// Peers to dial and redial, for networks without multicast.
    public var peers: [PeerAddress]
    /// Relays of the group to dial and redial (outbound only: a device behind NAT needs no open
    /// port). A relay must be enrolled first (``Replica/enrolRelay(at:code:)``).
    public var relays: [PeerAddress] = []
    /// Advertise and find peers of the group on the LAN with DNS-SD.
    public var discovery: Bool
    /// The name peers see; nil uses the replica's name.
    public var name: String?
    public var timing: SyncTiming
    public var limits: SyncLimits
    public var transfer: TransferMode
    /// Serve and fetch attachment bytes (announced in the hello; needs a storage that keeps
    /// them). Off, the node behaves as one that predates attachment transfer.
    public var attachments = true
    /// Deflate catch-up chunks for peers that read them (announced in the hello,
    /// docs/PROTOCOL.md §5.2): a first sync of 100k records sends about half the bytes, for
    /// zlib's fastest level on both sides. Off, the node neither announces nor sends them
    /// (docs/SECURITY.md: compression and record contents an outsider can choose).
    public var deflateChunks = true
    /// Wall clock, ms since 1970 — for the HLC and the skew check only (tests inject skew).
    public var wallClock: @Sendable () -> UInt64

    public init(
        security: SessionSecurity, listen: PeerAddress? = PeerAddress(host: "0.0.0.0", port: 0), peers: [PeerAddress] = [],
        discovery: Bool = false, name: String? = nil, timing: SyncTiming = SyncTiming(), limits: SyncLimits = SyncLimits(),
        transfer: TransferMode = .deltas, relays: [PeerAddress] = [],
        wallClock: @escaping @Sendable () -> UInt64 = HybridLogicalClock.wallClock
    ) {
        self.security = security
        self.listen = listen
        self.peers = peers
        self.relays = relays
        self.discovery = discovery
        self.name = name
        self.timing = timing
        self.limits = limits
        self.transfer = transfer
        self.wallClock = wallClock
    }
}
