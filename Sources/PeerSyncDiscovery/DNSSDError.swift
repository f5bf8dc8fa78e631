/// An error code from the DNS-SD API (`DNSServiceErrorType`), with a readable name.
///
/// On Linux the API is Avahi's Bonjour compatibility layer. It reports most failures to reach
/// or use the avahi daemon (no daemon, D-Bus unreachable, daemon gone, timeouts) as
/// `kDNSServiceErr_Unknown` (-65537); ``isDaemonUnreachable`` tells that case apart.
public struct DNSSDError: Error, Equatable, Hashable, Sendable, CustomStringConvertible {
    /// The raw `DNSServiceErrorType` value (a negative number; 0 is "no error").
    public let code: Int32

    /// Wraps a raw `DNSServiceErrorType` value.
    public init(code: Int32) {
        self.code = code
    }

    /// `kDNSServiceErr_Unknown`: what the compat layer returns when no avahi daemon is reachable.
    public static let unknown = DNSSDError(code: -65537)
    /// `kDNSServiceErr_BadParam`: an invalid name, type or TXT record.
    public static let badParam = DNSSDError(code: -65540)
    /// `kDNSServiceErr_Unsupported`: a call or flag the compat layer does not implement.
    public static let unsupported = DNSSDError(code: -65544)

    /// True for `kDNSServiceErr_Unknown`, the compat layer's code for "daemon not reachable".
    public var isDaemonUnreachable: Bool { code == DNSSDError.unknown.code }

    /// The constant's name in `dns_sd.h`, e.g. `kDNSServiceErr_Unknown`.
    public var name: String {
        switch code {
        case 0: "kDNSServiceErr_NoError"
        case -65537: "kDNSServiceErr_Unknown"
        case -65538: "kDNSServiceErr_NoSuchName"
        case -65539: "kDNSServiceErr_NoMemory"
        case -65540: "kDNSServiceErr_BadParam"
        case -65541: "kDNSServiceErr_BadReference"
        case -65542: "kDNSServiceErr_BadState"
        case -65543: "kDNSServiceErr_BadFlags"
        case -65544: "kDNSServiceErr_Unsupported"
        case -65545: "kDNSServiceErr_NotInitialized"
        case -65547: "kDNSServiceErr_AlreadyRegistered"
        case -65548: "kDNSServiceErr_NameConflict"
        case -65549: "kDNSServiceErr_Invalid"
        case -65550: "kDNSServiceErr_Firewall"
        case -65551: "kDNSServiceErr_Incompatible"
        case -65552: "kDNSServiceErr_BadInterfaceIndex"
        case -65553: "kDNSServiceErr_Refused"
        case -65554: "kDNSServiceErr_NoSuchRecord"
        case -65555: "kDNSServiceErr_NoAuth"
        case -65556: "kDNSServiceErr_NoSuchKey"
        case -65557: "kDNSServiceErr_NATTraversal"
        case -65558: "kDNSServiceErr_DoubleNAT"
        case -65559: "kDNSServiceErr_BadTime"
        default: "DNSServiceErrorType"
        }
    }

    /// What the code usually means here, in words a person can act on.
    public var explanation: String {
        switch code {
        case -65537: "no avahi daemon reachable (is avahi-daemon running and D-Bus reachable?)"
        case -65540: "invalid service name, type or TXT record"
        case -65544: "not supported by the Avahi compatibility layer"
        case -65548: "service name already in use"
        case -65553: "refused by the avahi daemon (access denied or too many objects)"
        case -65551: "client library incompatible with the avahi daemon"
        default: "DNS-SD call failed"
        }
    }

    /// For example "kDNSServiceErr_Unknown (-65537): no avahi daemon reachable (is avahi-daemon
    /// running and D-Bus reachable?)".
    public var description: String {
        "\(name) (\(code)): \(explanation)"
    }
}
