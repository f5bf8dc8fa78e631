import PeerSyncReplication
import NIOCore
import NIOSSL
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity

/// TLS 1.2 with a pre-shared key from a group secret: how protocol-1 nodes talk. Kept to reach
/// such nodes with a clear "upgrade" error (docs/SECURITY.md, upgrade path).
struct TLSContexts: Sendable {
    let client: NIOSSLContext
    let server: NIOSSLContext
    /// The server side's key callback (also used by the device TLS listener of an upgraded group).
    let pskServerProvider: NIOPSKServerIdentityProvider

    static let cipherSuites = "ECDHE-PSK-CHACHA20-POLY1305:ECDHE-PSK-AES256-CBC-SHA"

    /// `onRefusedIdentity` is called (on a NIO thread) when a client presents another group's
    /// PSK identity, so the refusal is logged with its cause.
    init(secret: GroupSecret, onRefusedIdentity: @escaping @Sendable (String) -> Void = { _ in }) throws {
        let key = secret.preSharedKey
        let identity = "peersync/" + secret.groupTag
        var serverConfiguration = TLSConfiguration.makePreSharedKeyConfiguration()
        serverConfiguration.minimumTLSVersion = .tlsv12
        serverConfiguration.maximumTLSVersion = .tlsv12
        serverConfiguration.shutdownTimeout = DeviceTLS.shutdownTimeout
        serverConfiguration.cipherSuites = Self.cipherSuites
        serverConfiguration.pskHint = "peersync"
        let provider: NIOPSKServerIdentityProvider = { context in
            // A client of another group presents another tag; refusing here fails its handshake.
            guard context.clientIdentity == identity else {
                onRefusedIdentity(context.clientIdentity)
                throw TLSSetupError.otherGroup
            }
            var bytes = NIOSSLSecureBytes()
            bytes.append(contentsOf: key)
            return PSKServerIdentityResponse(key: bytes)
        }
        serverConfiguration.pskServerProvider = provider
        pskServerProvider = provider
        var clientConfiguration = TLSConfiguration.makePreSharedKeyConfiguration()
        clientConfiguration.minimumTLSVersion = .tlsv12
        clientConfiguration.maximumTLSVersion = .tlsv12
        clientConfiguration.shutdownTimeout = DeviceTLS.shutdownTimeout
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
