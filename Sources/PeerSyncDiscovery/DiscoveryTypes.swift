@_spi(Engine) import PeerSyncCRDT

/// What this node publishes on the LAN: a DNS-SD service instance of type `_peersync._tcp`.
///
/// The TXT record carries exactly three keys:
/// - `v`: the sync protocol version (decimal),
/// - `id`: the replica ID (32 lowercase hexadecimal digits),
/// - `g`: the group tag, an opaque string derived from the group secret. It lets members of a
///   group find each other; it must never be the group's name or reveal any data.
public struct PeerAdvertisement: Sendable, Hashable {
    /// The service instance name (at most 63 bytes of UTF-8). If another host already uses it,
    /// avahi picks "name #2" and ``DiscoveryEvent/registered(name:)`` reports the name in use.
    public var serviceName: String
    /// The TCP port the node listens on.
    public var port: UInt16
    /// The replica that this node serves; peers use it to tell nodes apart.
    public var replicaID: ReplicaID
    /// The opaque group tag (TXT key `g`; at most 253 bytes of UTF-8, so that "g=TAG" fits a
    /// TXT entry). A longer tag makes discovery report `kDNSServiceErr_BadParam` instead of registering.
    public var groupTag: String
    /// The sync protocol version (TXT key `v`).
    public var protocolVersion: Int

    /// An advertisement of `replicaID` on `port`, named `serviceName`, in the group with `groupTag`.
    public init(serviceName: String, port: UInt16, replicaID: ReplicaID, groupTag: String, protocolVersion: Int = 1) {
        self.serviceName = serviceName
        self.port = port
        self.replicaID = replicaID
        self.groupTag = groupTag
        self.protocolVersion = protocolVersion
    }

    /// The TXT record's key/value pairs, in the order they are published.
    public var txtEntries: [(key: String, value: String)] {
        [("v", String(protocolVersion)), ("id", replicaID.description), ("g", groupTag)]
    }
}

/// A peer found on the LAN: a resolved `_peersync._tcp` service instance other than this node's own.
public struct DiscoveredPeer: Sendable, Hashable {
    /// The service instance name as browsing reports it (unescaped).
    public var serviceName: String
    /// The peer's IPv4 address, dotted (from an A-record query of the service's host name).
    public var host: String
    /// The TCP port from the service's SRV record.
    public var port: UInt16
    /// The replica ID from TXT key `id`, or nil if absent or malformed.
    public var replicaID: ReplicaID?
    /// The group tag from TXT key `g`, or nil if absent.
    public var groupTag: String?
    /// The protocol version from TXT key `v`, or nil if absent or not a number.
    public var protocolVersion: Int?

    /// A peer with the given fields (tests and static configuration build these by hand).
    public init(serviceName: String, host: String, port: UInt16, replicaID: ReplicaID?, groupTag: String?,
                protocolVersion: Int?) {
        self.serviceName = serviceName
        self.host = host
        self.port = port
        self.replicaID = replicaID
        self.groupTag = groupTag
        self.protocolVersion = protocolVersion
    }
}

/// What ``PeerDiscovery`` reports.
public enum DiscoveryEvent: Sendable, Hashable {
    /// This node's advertisement is published under `name` (which may differ from the requested
    /// name after a conflict). Reported again after every re-registration (e.g. after an outage).
    case registered(name: String)
    /// A peer appeared, or a known peer's address, port or TXT data changed. The same peer
    /// resolved again with nothing changed is not reported twice.
    case found(DiscoveredPeer)
    /// A peer previously reported by ``found(_:)`` withdrew its service (or was not seen again
    /// after the local daemon came back). Browse removals are slow and unreliable for peers that
    /// just drop off the network: liveness belongs to the sync session, not to this event.
    case lost(serviceName: String)
    /// The avahi daemon is not reachable (at start, or it went away). Reported once per outage;
    /// discovery keeps retrying with bounded backoff and reports ``recovered`` when it is back.
    case unavailable(DNSSDError)
    /// The daemon is reachable again after ``unavailable(_:)``; registration and browsing resume.
    case recovered
}

/// DNS-SD TXT record encoding (RFC 6763 §6): a sequence of length-prefixed "key=value" strings.
enum TXTRecord {
    /// Encodes `entries`; nil if a key is empty or contains "=", or an entry exceeds 255 bytes.
    static func encode(_ entries: [(key: String, value: String)]) -> [UInt8]? {
        var bytes: [UInt8] = []
        for (key, value) in entries {
            guard !key.isEmpty, !key.utf8.contains(UInt8(ascii: "=")) else { return nil }
            let entry = Array(key.utf8) + [UInt8(ascii: "=")] + Array(value.utf8)
            guard entry.count <= 255 else { return nil }
            bytes.append(UInt8(entry.count))
            bytes.append(contentsOf: entry)
        }
        guard bytes.count <= Int(UInt16.max) else { return nil }
        return bytes
    }

    /// Decodes a TXT record into key → value. Keys compare case-insensitively (lowercased here);
    /// the first occurrence of a key wins; a key without "=" maps to "". Malformed tails are ignored.
    static func decode(_ bytes: UnsafeRawBufferPointer) -> [String: String] {
        var result: [String: String] = [:]
        var index = 0
        while index < bytes.count {
            let length = Int(bytes[index])
            index += 1
            guard length > 0 else { continue }
            guard index + length <= bytes.count else { break }
            let entry = bytes[index..<(index + length)]
            index += length
            let key: String
            let value: String
            if let equals = entry.firstIndex(of: UInt8(ascii: "=")) {
                key = String(decoding: entry[entry.startIndex..<equals], as: UTF8.self)
                value = String(decoding: entry[(equals + 1)...], as: UTF8.self)
            } else {
                key = String(decoding: entry, as: UTF8.self)
                value = ""
            }
            let lowered = key.lowercased()
            if !lowered.isEmpty, result[lowered] == nil { result[lowered] = value }
        }
        return result
    }
}
