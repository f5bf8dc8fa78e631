import PeerSyncReplication
import NIOCore
import NIOSSL
import NIOTLS
import PeerSyncIdentity
import Synchronization

/// Mutual TLS 1.3 between devices, each presenting a self-signed certificate for its device key
/// (``DeviceCertificate``) and admitting the other by its ``DeviceID``.
///
/// Both sides: TLS 1.3 only, empty trust roots, `certificateVerification = .noHostnameVerification`
/// (so a server *requires* a client certificate), and a custom verification callback that
/// replaces BoringSSL's chain checks: it computes the device ID of the peer's leaf certificate
/// and asks ``admit``. The certificate's names, issuer, dates and own signature are not looked
/// at — the TLS handshake (CertificateVerify) proves the peer holds the private key of the
/// certified public key, and the key's fingerprint is the identity.
///
/// After the handshake a second check (``PeerAdmissionHandler``) reads the peer certificate from
/// the `NIOSSLHandler`, recomputes the device ID, asks ``admit`` again and closes the channel if
/// the answer changed. This also covers TLS session resumption, where BoringSSL restores the
/// peer certificate from the ticket without calling the verification callback (NIOSSL offers no
/// switch to turn tickets off), so a device removed since cannot slip back in on an old ticket.
///
/// Measured (docs/SWIFT-NOTES): in TLS 1.3 a client that the *server* refuses sees its own
/// handshake complete and gets the error on its first read; treat a peer as authenticated only
/// after its first application message arrived.
package struct DeviceTLS: Sendable {
    /// This device.
    public let deviceID: DeviceID
    /// The certificate it presents.
    public let certificate: DeviceCertificate
    /// Whether a peer device may connect (either direction). Called on the channel's event loop
    /// during and right after each handshake: it must not block.
    public let admit: @Sendable (DeviceID) -> Bool
    let clientContext: NIOSSLContext
    let serverContext: NIOSSLContext
    /// For a group upgraded from a shared secret: TLS 1.2 with its pre-shared key, to reach
    /// nodes of the previous version (they then hear "upgrade"; no data crosses).
    let legacyClientContext: NIOSSLContext?
    let acceptsLegacy: Bool

    /// TLS contexts for `key`, presenting `certificate` (made now if nil) and admitting peers
    /// for which `admit` returns true.
    ///
    /// - Throws: ``DeviceTLSError/certificateForAnotherKey``, or NIOSSL's error if BoringSSL
    ///   refuses the key or certificate.
    public init(
        key: DeviceKey, certificate: DeviceCertificate? = nil, legacySecret: GroupSecret? = nil,
        admit: @escaping @Sendable (DeviceID) -> Bool
    ) throws {
        try self.init(key: key, certificate: certificate, curves: nil, legacySecret: legacySecret, admit: admit)
    }

    /// `curves`: key exchange groups, nil for NIOSSL's default (X25519MLKEM768 hybrid first, then
    /// X25519, P-256, P-384). Only the handshake measurement uses another set.
    init(
        key: DeviceKey, certificate: DeviceCertificate?, curves: [NIOTLSCurve]?, legacySecret: GroupSecret? = nil,
        admit: @escaping @Sendable (DeviceID) -> Bool
    ) throws {
        let certificate = try certificate ?? DeviceCertificate.make(key: key)
        guard certificate.deviceID == key.deviceID else { throw DeviceTLSError.certificateForAnotherKey }
        deviceID = key.deviceID
        self.certificate = certificate
        self.admit = admit
        let chain: [NIOSSLCertificateSource] = [.certificate(try NIOSSLCertificate(bytes: certificate.derBytes, format: .der))]
        let privateKey = NIOSSLPrivateKeySource.privateKey(
            try NIOSSLPrivateKey(bytes: Array(key.privateKey.derRepresentation), format: .der))
        var server = TLSConfiguration.makeServerConfiguration(certificateChain: chain, privateKey: privateKey)
        var client = TLSConfiguration.makeClientConfiguration()
        client.certificateChain = chain
        client.privateKey = privateKey
        Self.restrict(&server)
        Self.restrict(&client)
        server.curves = curves
        client.curves = curves
        if let legacySecret {
            // The same listener also speaks TLS 1.2 with the old group's pre-shared key, so a node
            // of the previous version that dials in is told to upgrade instead of failing silently.
            let legacy = try TLSContexts(secret: legacySecret)
            server.minimumTLSVersion = .tlsv12
            server.cipherSuites = TLSContexts.cipherSuites
            server.pskHint = "peersync"
            server.pskServerProvider = legacy.pskServerProvider
            legacyClientContext = legacy.client
        } else {
            legacyClientContext = nil
        }
        acceptsLegacy = legacySecret != nil
        serverContext = try NIOSSLContext(configuration: server)
        clientContext = try NIOSSLContext(configuration: client)
    }

    /// How long a closing connection waits for the peer's TLS close_notify before it closes
    /// anyway. Everything of ours (a goodbye, an error) is written before our close_notify, and
    /// nothing is read after it, so waiting gains nothing — and NIOSSL's default (5 s) let a peer
    /// that broke a rule hold its connection, and an inbound slot, for 5 s after the refusal.
    static let shutdownTimeout: TimeAmount = .seconds(1)

    private static func restrict(_ configuration: inout TLSConfiguration) {
        configuration.shutdownTimeout = shutdownTimeout
        configuration.minimumTLSVersion = .tlsv13
        configuration.maximumTLSVersion = .tlsv13
        configuration.trustRoots = .certificates([])
        configuration.certificateVerification = .noHostnameVerification
    }

    /// Adds the TLS handler and the post-handshake admission check to `channel`'s pipeline (call
    /// on its event loop, e.g. from a bootstrap's channel initializer), at the socket end: add a
    /// byte counter before it if wanted, framing after it.
    ///
    /// - Parameters:
    ///   - dialed: true on the side that connected (TLS client), false on the accepting side.
    ///   - expecting: when dialing a particular device (e.g. the inviter named by an invite code),
    ///     its ID: any other device is refused even if ``admit`` would take it.
    /// - Returns: the peer's verdict, and a future of its device ID once admitted.
    @discardableResult
    public func configure(_ channel: any Channel, dialed: Bool, expecting: DeviceID? = nil) throws -> TLSPeer {
        let peer = TLSPeer(promise: channel.eventLoop.makePromise(of: DeviceID.self))
        let admit = self.admit
        let verify: NIOSSLCustomVerificationCallback = { certificates, promise in
            promise.succeed(peer.decide(certificates.first, expecting: expecting, admit: admit) ? .certificateVerified : .failed)
        }
        let operations = channel.pipeline.syncOperations
        if dialed {
            try operations.addHandler(
                try NIOSSLClientHandler(context: clientContext, serverHostname: nil, customVerificationCallback: verify))
        } else {
            try operations.addHandler(NIOSSLServerHandler(context: serverContext, customVerificationCallback: verify))
        }
        try operations.addHandler(PeerAdmissionHandler(peer: peer, expecting: expecting, admit: admit, acceptsLegacy: acceptsLegacy))
        return peer
    }

    /// Like ``configure(_:dialed:expecting:)`` for dialing a node of the previous version: TLS 1.2
    /// with the old group's pre-shared key (nil if this group has none).
    public func configureLegacyClient(_ channel: any Channel) throws -> TLSPeer? {
        guard let legacyClientContext else { return nil }
        let peer = TLSPeer(promise: channel.eventLoop.makePromise(of: DeviceID.self))
        try channel.pipeline.syncOperations.addHandler(try NIOSSLClientHandler(context: legacyClientContext, serverHostname: nil))
        try channel.pipeline.syncOperations.addHandler(PeerAdmissionHandler(peer: peer, expecting: nil, admit: { _ in false }, acceptsLegacy: true))
        return peer
    }

    /// The device ID of the peer of an established TLS channel (from the certificate the
    /// `NIOSSLHandler` holds), or nil before the handshake. Call on the channel's event loop.
    public static func peerDeviceID(in pipeline: ChannelPipeline.SynchronousOperations) throws -> DeviceID? {
        let handler = try pipeline.handler(type: NIOSSLHandler.self)
        guard let certificate = handler.peerCertificate else { return nil }
        return try DeviceID(certificateDER: certificate.toDERBytes())
    }
}

/// What the TLS layer learned about the device at the other end of one channel.
package final class TLSPeer: Sendable {
    /// The outcome of the certificate checks.
    package enum Verdict: Hashable, Sendable, CustomStringConvertible {
        /// No certificate checked yet.
        case pending
        /// The peer is this device, and it is admitted.
        case admitted(DeviceID)
        /// The peer is this device, and it was refused.
        case refused(DeviceID, reason: String)
        /// The peer's certificate yields no device ID.
        case invalidCertificate(String)

        public var description: String {
            switch self {
            case .pending: "TLS handshake not finished"
            case .admitted(let id): "device \(id) admitted"
            case let .refused(id, reason): "device \(id) refused: \(reason)"
            case .invalidCertificate(let reason): "peer refused: \(reason)"
            }
        }
    }

    private let state = Mutex<Verdict>(.pending)
    private let promise: EventLoopPromise<DeviceID>

    init(promise: EventLoopPromise<DeviceID>) { self.promise = promise }

    /// The current verdict.
    public var verdict: Verdict { state.withLock { $0 } }

    /// The peer's device ID once admitted (nil while pending or if refused).
    public var deviceID: DeviceID? {
        if case .admitted(let id) = verdict { return id }
        return nil
    }

    /// Succeeds with the peer's device ID when the handshake completed and the peer was
    /// admitted; fails with ``DeviceTLSError`` (or the TLS error) otherwise, including when the
    /// channel closes first. (On the client this can succeed even though the server then refuses
    /// the client: see ``DeviceTLS``.)
    public var authenticated: EventLoopFuture<DeviceID> { promise.futureResult }

    /// Checks a presented leaf certificate; records and returns the decision.
    func decide(_ leaf: NIOSSLCertificate?, expecting: DeviceID?, admit: (DeviceID) -> Bool) -> Bool {
        let verdict: Verdict
        if let leaf {
            do {
                let id = try DeviceID(certificateDER: leaf.toDERBytes())
                if let expecting, id != expecting {
                    verdict = .refused(id, reason: "expected device \(expecting)")
                } else if !admit(id) {
                    verdict = .refused(id, reason: "not a member of this group")
                } else {
                    verdict = .admitted(id)
                }
            } catch let error as DeviceIDError {
                verdict = .invalidCertificate(error.description)
            } catch {
                verdict = .invalidCertificate("unreadable certificate: \(error)")
            }
        } else {
            verdict = .invalidCertificate("peer presented no certificate")
        }
        state.withLock { $0 = verdict }
        if case .admitted = verdict { return true }
        return false
    }

    func succeed(_ id: DeviceID) { promise.succeed(id) }

    func fail(_ error: any Error) {
        promise.fail(error)
    }
}

/// Why a TLS peer was not accepted.
package enum DeviceTLSError: Error, Hashable, CustomStringConvertible {
    /// The peer's certificate was checked and refused (see the verdict).
    case refused(TLSPeer.Verdict)
    /// The channel closed before the handshake finished.
    case closedBeforeHandshake
    /// The handshake finished with another TLS version (cannot happen with ``DeviceTLS``'s configuration).
    case notTLS13
    /// The peer speaks TLS 1.2 with the old group secret: a node of the previous version. The
    /// channel stays open for the session to tell it to upgrade; no device was authenticated.
    case legacyPeer
    /// ``DeviceTLS/init(key:certificate:admit:)`` was given a certificate for another key.
    case certificateForAnotherKey

    public var description: String {
        switch self {
        case .refused(let verdict): "TLS peer refused: \(verdict)"
        case .closedBeforeHandshake: "connection closed before the TLS handshake finished (refused by the peer, or not a PeerSync device)"
        case .notTLS13: "TLS handshake did not negotiate TLS 1.3"
        case .legacyPeer: "the peer speaks TLS 1.2 with the old group secret (a node of the previous version)"
        case .certificateForAnotherKey: "the device certificate does not certify this device's key"
        }
    }
}

/// Re-checks the peer when the handshake completes (covers resumed sessions), and settles
/// ``TLSPeer/authenticated``.
final class PeerAdmissionHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer

    private let peer: TLSPeer
    private let expecting: DeviceID?
    private let admit: @Sendable (DeviceID) -> Bool
    private let acceptsLegacy: Bool
    private var settled = false

    init(peer: TLSPeer, expecting: DeviceID?, admit: @escaping @Sendable (DeviceID) -> Bool, acceptsLegacy: Bool = false) {
        self.peer = peer
        self.expecting = expecting
        self.admit = admit
        self.acceptsLegacy = acceptsLegacy
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if let event = event as? TLSUserEvent, case .handshakeCompleted = event, !settled {
            settled = true
            let tls = try? context.pipeline.syncOperations.handler(type: NIOSSLHandler.self)
            if acceptsLegacy, tls?.tlsVersion == .tlsv12 {
                peer.fail(DeviceTLSError.legacyPeer)  // the session goes on, to say "upgrade"
                context.fireUserInboundEventTriggered(event)
                return
            }
            if tls?.tlsVersion != .tlsv13 {
                peer.fail(DeviceTLSError.notTLS13)
                context.close(promise: nil)
                return
            }
            if peer.decide(tls?.peerCertificate, expecting: expecting, admit: admit), let id = peer.deviceID {
                peer.succeed(id)
            } else {
                peer.fail(DeviceTLSError.refused(peer.verdict))
                context.close(promise: nil)
                return
            }
        }
        context.fireUserInboundEventTriggered(event)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if !settled {
            settled = true
            if case .refused = peer.verdict {
                peer.fail(DeviceTLSError.refused(peer.verdict))
            } else {
                peer.fail(error)
            }
        }
        context.fireErrorCaught(error)
    }

    /// A channel torn down without ever becoming active (or inactive) must still settle the
    /// promise, or NIO reports it leaked.
    func handlerRemoved(context: ChannelHandlerContext) {
        if !settled {
            settled = true
            peer.fail(DeviceTLSError.closedBeforeHandshake)
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        if !settled {
            settled = true
            if case .refused = peer.verdict {
                peer.fail(DeviceTLSError.refused(peer.verdict))
            } else {
                peer.fail(DeviceTLSError.closedBeforeHandshake)
            }
        }
        context.fireChannelInactive()
    }
}
