@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
@testable import PeerSyncReplication
@testable import PeerSyncNetwork
import PeerSyncTestSupport
@testable import PeerSyncWire
import Testing

/// The session rules, without sockets.
@Suite("Session state machine")
struct StateMachineTests {
    let now: UInt64 = 1_700_000_000_000
    static let deviceKey = DeviceKey.generate().publicKey.x963
    var machine = SessionStateMachine(localReplica: testReplica(0), maxClockSkewMilliseconds: 300_000)
    /// The session's phase, moved as the core moves it — but straight to established once the
    /// hello is accepted (these tests have no admission), and to closing on a close.
    var phase = PeerSession.Phase.awaitingHello

    func frame(_ message: Message) -> (UInt8, [UInt8]) {
        (message.kind.rawValue, message.body())
    }

    func hello(replica: Int = 1, clock: UInt64? = nil, version: UInt64 = WireLimits.protocolVersion) -> Message {
        .hello(Hello(protocolVersion: version, replicaID: testReplica(replica), name: "peer",
                     wallClockMilliseconds: clock ?? now, context: CausalContext(), digest: .empty,
                     groupID: Array(repeating: 1, count: 16), deviceKey: Self.deviceKey, nonce: Array(repeating: 2, count: 16)))
    }

    mutating func receive(_ message: Message) -> [SessionStateMachine.Action] {
        let (type, body) = frame(message)
        return receive(type: type, body: body)
    }

    mutating func receive(type: UInt8, body: [UInt8]) -> [SessionStateMachine.Action] {
        let actions = machine.receive(type: type, body: body, now: now, in: phase)
        for action in actions {
            if case .helloAccepted = action { phase = .established }
            if case .close = action { phase = .closing }
        }
        return actions
    }

    func closeReason(_ actions: [SessionStateMachine.Action]) -> CloseReason? {
        for case .close(let reason, _, _) in actions { return reason }
        return nil
    }

    @Test("hello first, then catch-up and deltas")
    mutating func happyPath() {
        guard case .helloAccepted(let peer)? = receive(hello()).first else { Issue.record("not established"); return }
        #expect(peer.replicaID == testReplica(1))
        #expect(phase == .established)
        if case .send(.pong(9))? = receive(.ping(9)).first {} else { Issue.record("no pong") }
    }

    @Test("anything before hello closes the session")
    mutating func helloFirst() {
        #expect(closeReason(receive(.ping(1))) == .malformed)
        #expect(phase == .closing)
        #expect(receive(hello()).isEmpty)
    }

    @Test("other protocol version, own replica, skewed clock are refused with reasons")
    func refusals() {
        var m1 = self
        #expect(m1.closeReason(m1.receive(hello(version: 1))) == .protocolVersion)
        var m2 = self
        #expect(m2.closeReason(m2.receive(hello(replica: 0))) == .sameReplica)
        var m3 = self
        let actions = m3.receive(hello(clock: now + 3_600_000))
        #expect(m3.closeReason(actions) == .clockSkew)
        if case .close(_, let text, true)? = actions.first { #expect(text.contains("1 h 0 min ahead")) }
        var m4 = self
        #expect(m4.closeReason(m4.receive(hello(clock: now - 299_000))) == nil)
    }

    @Test("chunks must come in order")
    mutating func chunkOrder() {
        _ = receive(hello())
        let empty = WireDelta.encode(RecordMap(), with: WireDictionary(startingAt: now))
        #expect(closeReason(receive(.chunk(index: 1, count: 3, records: 0, delta: empty))) == .malformed)
    }

    @Test("a delta with a timestamp far in the future is refused")
    mutating func futureTimestamp() {
        _ = receive(hello())
        var map = RecordMap()
        let sender = WireDictionary(startingAt: now)
        _ = try! map.write(["x": 1], to: RecordKey(collection: "c", id: UUID()),
                      at: HLCTimestamp(physicalMilliseconds: now + 86_400_000, logical: 0), by: testReplica(1))
        #expect(closeReason(receive(.delta(WireDelta.encode(map, with: sender)))) == .malformed)
    }

    @Test("garbage, unknown types and a second hello close the session")
    mutating func garbage() {
        _ = receive(hello())
        var copy = self
        #expect(copy.closeReason(copy.receive(type: 77, body: [1, 2])) == .unknownMessage)
        var again = self
        #expect(again.closeReason(again.receive(hello())) == .malformed)
        #expect(closeReason(receive(type: Message.Kind.delta.rawValue, body: [9, 9, 9])) == .malformed)
    }

    @Test("offsets read the same from both sides: rounded, not truncated")
    func offsetsRounded() {
        #expect(formatSeconds(3_599.85) == "1 h 0 min")
        #expect(formatSeconds(3_600.2) == "1 h 0 min")
        #expect(formatSeconds(5_430) == "1 h 31 min")
        #expect(formatSeconds(59.6) == "1 min 0 s")
        #expect(formatSeconds(125.4) == "2 min 5 s")
        #expect(formatSeconds(0.4) == "0 s")
        #expect(formatSeconds(.infinity) == "inf s")
    }
}
