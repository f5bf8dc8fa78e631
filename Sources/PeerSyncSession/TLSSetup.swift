import NIOCore
import NIOSSL
import PeerSyncCRDT

/// How sessions are protected.
public enum SessionSecurity: Sendable {
    /// TLS 1.2 with an ECDHE pre-shared-key cipher suite; the key is derived from the group
    /// secret, so only members complete the handshake (see docs/SECURITY.md).
    case groupSecret(GroupSecret)
    /// Plain TCP, for debugging only: anyone on the network can read and write the data.
    case insecure

    var isInsecure: Bool {
        if case .insecure = self { return true }
        return false
    }
}

/// The TLS contexts of one node: the same pre-shared key on both sides of every connection.
struct TLSContexts: Sendable {
    let client: NIOSSLContext
    let server: NIOSSLContext

    static let cipherSuites = "ECDHE-PSK-CHACHA20-POLY1305:ECDHE-PSK-AES256-CBC-SHA"

    /// `onRefusedIdentity` is called (on a NIO thread) when a client presents another group's
    /// PSK identity, so the refusal is logged with its cause.
    init(secret: GroupSecret, onRefusedIdentity: @escaping @Sendable (String) -> Void = { _ in }) throws {
        let key = secret.preSharedKey
        let identity = "peersync/" + secret.groupTag
        var serverConfiguration = TLSConfiguration.makePreSharedKeyConfiguration()
        serverConfiguration.minimumTLSVersion = .tlsv12
        serverConfiguration.maximumTLSVersion = .tlsv12
        serverConfiguration.cipherSuites = Self.cipherSuites
        serverConfiguration.pskHint = "peersync"
        serverConfiguration.pskServerProvider = { context in
            // A client of another group presents another tag; refusing here fails its handshake.
            guard context.clientIdentity == identity else {
                onRefusedIdentity(context.clientIdentity)
                throw TLSSetupError.otherGroup
            }
            var bytes = NIOSSLSecureBytes()
            bytes.append(contentsOf: key)
            return PSKServerIdentityResponse(key: bytes)
        }
        var clientConfiguration = TLSConfiguration.makePreSharedKeyConfiguration()
        clientConfiguration.minimumTLSVersion = .tlsv12
        clientConfiguration.maximumTLSVersion = .tlsv12
        clientConfiguration.cipherSuites = Self.cipherSuites
        clientConfiguration.pskClientProvider = { _ in
            var bytes = NIOSSLSecureBytes()
            bytes.append(contentsOf: key)
            return PSKClientIdentityResponse(key: bytes, identity: identity)
        }
        server = try NIOSSLContext(configuration: serverConfiguration)
        client = try NIOSSLContext(configuration: clientConfiguration)
    }
}

enum TLSSetupError: Error, CustomStringConvertible {
    case otherGroup
    var description: String { "peer presented the identity of another sync group" }
}
