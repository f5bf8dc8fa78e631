import PeerSyncReplication
import NIOCore
import NIOPosix
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncWire

/// Checks whether a peer answers like a PeerSync node of this group, without syncing:
/// connects, completes the handshake, sends an empty hello, reads the peer's hello, closes.
package enum SessionProbe {
    package struct Result: Sendable {
        /// The peer's hello, if it got that far.
        public let hello: Hello?
        /// Why it did not, in words a person can act on.
        public let failure: String?
        /// Peer's wall clock minus ours, in ms (when a hello arrived).
        public let clockOffsetMilliseconds: Int64?
    }

    public static func probe(_ address: PeerAddress, security: SessionSecurity, groupID: GroupID,
                             timeout: Duration = .seconds(3)) async -> Result {
        // A throwaway device: the probe only reads the peer's hello, which comes first.
        let key = DeviceKey.generate()
        let tls: DeviceTLS?
        do {
            tls = security == .tls ? try DeviceTLS(key: key) { _ in true } : nil
        } catch {
            return Result(hello: nil, failure: "cannot set up TLS: \(error)", clockOffsetMilliseconds: nil)
        }
        do {
            let (channel, _) = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .connectTimeout(.milliseconds(timeout.wholeMilliseconds))
                .connect(host: address.host, port: Int(address.port)) { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try SyncNode.configurePipeline(channel, tls: tls, dialed: true, maxFrame: WireLimits.defaultMaxFrameBytes)
                    }
                }
            let now = HybridLogicalClock.wallClock()
            let hello = Hello(replicaID: .random(), name: "peersync doctor", wallClockMilliseconds: now,
                              context: CausalContext(), digest: .empty, groupID: groupID.bytes, deviceKey: key.publicKey.x963,
                              nonce: (0..<16).map { _ in UInt8.random(in: 0...255) })
            let killer = Task {
                try? await Task.sleep(for: timeout)
                try? await channel.channel.close()
            }
            defer { killer.cancel() }
            return try await channel.executeThenClose { inbound, outbound in
                try await outbound.write(ByteBuffer(bytes: Message.hello(hello).encodedFrame()))
                for try await frame in inbound.frames {
                    switch try Message.decode(type: frame.type, body: frame.body) {
                    case .hello(let peer):
                        return Result(hello: peer, failure: nil,
                                      clockOffsetMilliseconds: Int64(bitPattern: peer.wallClockMilliseconds &- now))
                    case .error(let reason, let text), .goodbye(let reason, let text):
                        return Result(hello: nil, failure: "peer refused: \(reason): \(text)", clockOffsetMilliseconds: nil)
                    default:
                        return Result(hello: nil, failure: "peer did not start with a hello", clockOffsetMilliseconds: nil)
                    }
                }
                return Result(hello: nil, failure: "connection closed before a hello (another group's secret, or not a PeerSync node?)",
                              clockOffsetMilliseconds: nil)
            }
        } catch {
            return Result(hello: nil, failure: SyncNode.classify(error).description, clockOffsetMilliseconds: nil)
        }
    }
}
