/// How TCP sessions are protected. Either way, every session authenticates the peer's device
/// (a signature with its device key) and admits it only if the roster does.
public enum SessionSecurity: Sendable, Equatable {
    /// Mutual TLS 1.3, each side presenting a certificate made from its device key (default).
    case tls
    /// Plain TCP, for debugging only: anyone on the network can read the traffic (devices are
    /// still authenticated, but nothing is encrypted).
    case insecure

    package var isInsecure: Bool { self == .insecure }
}
