@_spi(Engine) import PeerSyncCRDT
import Testing

@testable import PeerSyncDiscovery

/// The discovery policy on its own: events in, actions out, no DNS-SD, no daemon, no clock (time
/// is a base instant advanced by hand).
@Suite("Discovery policy")
struct DiscoveryPolicyTests {
    typealias Policy = DiscoveryPolicy

    static let ownID = ReplicaID(hex: "00000000000000000000000000000001")!
    static let idA = ReplicaID(hex: "0000000000000000000000000000000a")!
    static let idB = ReplicaID(hex: "0000000000000000000000000000000b")!
    static let a = ServiceKey(name: "peer-a", type: "_peersync._tcp.", domain: "local.")
    static let b = ServiceKey(name: "peer-b", type: "_peersync._tcp.", domain: "local.")
    static let me = ServiceKey(name: "me", type: "_peersync._tcp.", domain: "local.")

    static func txt(_ id: ReplicaID, group: String = "c0ffee0123456789", version: String = "1") -> [String: String] {
        ["v": version, "id": id.description, "g": group]
    }

    static func peer(_ key: ServiceKey, _ id: ReplicaID, host: String, port: UInt16, group: String = "c0ffee0123456789")
        -> DiscoveredPeer
    {
        DiscoveredPeer(serviceName: key.name, host: host, port: port, replicaID: id, groupTag: group, protocolVersion: 1)
    }

    /// A policy and the instant its events happen at.
    struct Harness {
        static let base = ContinuousClock.now  // read once: only differences from it matter
        var policy = Policy(
            advertisement: PeerAdvertisement(serviceName: "me", port: 7000, replicaID: DiscoveryPolicyTests.ownID,
                                              groupTag: "c0ffee0123456789"),
            startingAt: Harness.base)
        var now = Harness.base

        mutating func send(_ event: Policy.Event) -> [Policy.Action] { policy.handle(event, at: now) }

        /// Advances the time by `duration`, then ticks.
        mutating func tick(after duration: Duration = .zero) -> [Policy.Action] {
            now += duration
            return send(.tick)
        }

        /// Ticks and connects (register + browse succeed).
        mutating func connect() -> [Policy.Action] {
            #expect(tick() == [.connect])
            return send(.daemonConnected)
        }

        /// Browse add of `key`, then its SRV/TXT and A record; returns the actions of the last step.
        mutating func resolve(_ key: ServiceKey, interface: UInt32 = 2, host: String, port: UInt16,
                              txt: [String: String]) -> [Policy.Action] {
            #expect(send(.browseAdded(key, interfaceIndex: interface)) == [.startResolve(key, interfaceIndex: interface)])
            #expect(send(.resolved(key, hostTarget: "\(key.name).local.", interfaceIndex: interface, port: port, txt: txt))
                == [.cancel(.resolve(key)), .startAddressQuery(key, hostTarget: "\(key.name).local.", interfaceIndex: interface)])
            return send(.addressResolved(key, ipv4: host))
        }

        /// Register or browse fails: the daemon went away.
        mutating func loseDaemon() -> [Policy.Action] {
            send(.operationFailed(.browse, .unknown))
        }
    }

    static func reports(_ actions: [Policy.Action]) -> [DiscoveryEvent] {
        actions.compactMap { if case .report(let event) = $0 { event } else { nil } }
    }

    // MARK: - Presence and de-duplication

    @Test("An IPv6 double of a browse add starts no second resolve, and the peer is found once")
    func ipv6DoublesCollapse() {
        var h = Harness()
        #expect(h.connect() == [])
        #expect(h.send(.browseAdded(Self.a, interfaceIndex: 2)) == [.startResolve(Self.a, interfaceIndex: 2)])
        #expect(h.send(.browseAdded(Self.a, interfaceIndex: 2)) == [])  // the IPv6 double
        #expect(h.send(.resolved(Self.a, hostTarget: "a.local.", interfaceIndex: 2, port: 7001, txt: Self.txt(Self.idA)))
            == [.cancel(.resolve(Self.a)), .startAddressQuery(Self.a, hostTarget: "a.local.", interfaceIndex: 2)])
        let found = h.send(.addressResolved(Self.a, ipv4: "10.77.0.11"))
        #expect(found == [.cancel(.addressQuery(Self.a)), .report(.found(Self.peer(Self.a, Self.idA, host: "10.77.0.11", port: 7001)))])
        // One remove (of the IPv4 or the IPv6 event) leaves it present; the second removes it.
        #expect(h.send(.browseRemoved(Self.a)) == [])
        #expect(h.send(.browseRemoved(Self.a)) == [.report(.lost(serviceName: "peer-a"))])
        #expect(h.policy.services.isEmpty)

        // A double that arrives after the resolution finished starts nothing either.
        let peerB = Self.peer(Self.b, Self.idB, host: "10.77.0.12", port: 7002)
        #expect(Self.reports(h.resolve(Self.b, host: "10.77.0.12", port: 7002, txt: Self.txt(Self.idB))) == [.found(peerB)])
        #expect(h.send(.browseAdded(Self.b, interfaceIndex: 2)) == [])
        #expect(h.policy.services[Self.b]?.presence == 2)
    }

    @Test("A service seen on two interfaces stays present when one of them removes it")
    func removeOfOneInterfaceKeepsIt() {
        var h = Harness()
        _ = h.connect()
        #expect(Self.reports(h.resolve(Self.a, interface: 2, host: "10.77.0.11", port: 7001, txt: Self.txt(Self.idA))).count == 1)
        #expect(h.send(.browseAdded(Self.a, interfaceIndex: 3)) == [])
        #expect(h.send(.browseRemoved(Self.a)) == [])
        #expect(h.policy.services[Self.a]?.presence == 1)
        #expect(h.send(.browseRemoved(Self.a)) == [.report(.lost(serviceName: "peer-a"))])
        #expect(h.send(.browseRemoved(Self.a)) == [])  // a stray remove of a forgotten instance
    }

    @Test("Repeated resolve and address answers with the same result are reported once")
    func repeatedResolvesReportOnce() {
        var h = Harness()
        _ = h.connect()
        let peer = Self.peer(Self.a, Self.idA, host: "10.77.0.11", port: 7001)
        #expect(Self.reports(h.resolve(Self.a, host: "10.77.0.11", port: 7001, txt: Self.txt(Self.idA))) == [.found(peer)])
        // Late duplicates of both answers only drop their references.
        #expect(h.send(.resolved(Self.a, hostTarget: "a.local.", interfaceIndex: 2, port: 7001, txt: Self.txt(Self.idA)))
            == [.cancel(.resolve(Self.a))])
        #expect(h.send(.addressResolved(Self.a, ipv4: "10.77.0.11")) == [.cancel(.addressQuery(Self.a))])

        // After an outage the peer is browsed and resolved again, with the same result: not reported.
        _ = h.loseDaemon()
        #expect(Self.reports(h.tick(after: .milliseconds(500)) + h.send(.daemonConnected)) == [.recovered])
        #expect(Self.reports(h.resolve(Self.a, host: "10.77.0.11", port: 7001, txt: Self.txt(Self.idA))) == [])
        #expect(Self.reports(h.tick(after: Policy.staleGrace)) == [])
        #expect(h.policy.services[Self.a]?.reported == peer)
    }

    @Test("A changed port, TXT or address is reported again")
    func changesAreReportedAgain() {
        var h = Harness()
        _ = h.connect()
        _ = h.resolve(Self.a, host: "10.77.0.11", port: 7001, txt: Self.txt(Self.idA))
        let changes: [(host: String, port: UInt16, group: String)] = [
            ("10.77.0.11", 7101, "c0ffee0123456789"),  // port
            ("10.77.0.11", 7101, "0123456789abcdef"),  // TXT (group tag)
            ("10.77.0.21", 7101, "0123456789abcdef"),  // address
        ]
        for change in changes {
            _ = h.loseDaemon()
            _ = h.tick(after: Policy.longestReconnectDelay)
            _ = h.send(.daemonConnected)
            let actions = h.resolve(Self.a, host: change.host, port: change.port, txt: Self.txt(Self.idA, group: change.group))
            #expect(Self.reports(actions) == [.found(Self.peer(Self.a, Self.idA, host: change.host, port: change.port, group: change.group))])
        }
    }

    @Test("This node's own advertisement is never reported: not found, not lost, not kept over an outage")
    func selfAdvertIsNeverReported() {
        var h = Harness()
        _ = h.connect()
        #expect(h.send(.browseAdded(Self.me, interfaceIndex: 2)) == [.startResolve(Self.me, interfaceIndex: 2)])
        // Same replica ID: no address query, no report, no deadline left behind.
        #expect(h.send(.resolved(Self.me, hostTarget: "me.local.", interfaceIndex: 2, port: 7000, txt: Self.txt(Self.ownID)))
            == [.cancel(.resolve(Self.me))])
        #expect(h.policy.services[Self.me]?.isSelf == true)
        #expect(h.policy.nextDeadline == nil)
        _ = h.loseDaemon()
        #expect(h.policy.services[Self.me] == nil)
        _ = h.tick(after: .milliseconds(500))
        _ = h.send(.daemonConnected)
        _ = h.send(.browseAdded(Self.me, interfaceIndex: 2))
        _ = h.send(.resolved(Self.me, hostTarget: "me.local.", interfaceIndex: 2, port: 7000, txt: Self.txt(Self.ownID)))
        #expect(Self.reports(h.send(.browseRemoved(Self.me)) + h.tick(after: .seconds(60))) == [])

        // A browse-only run (no advertisement) reports every instance, its own kind included.
        var browser = Harness()
        browser.policy = Policy(advertisement: nil, startingAt: Harness.base)
        _ = browser.connect()
        #expect(Self.reports(browser.resolve(Self.me, host: "10.77.0.10", port: 7000, txt: Self.txt(Self.ownID))).count == 1)
    }

    @Test("The registered name is reported once per registration, again after an outage")
    func registeredNameReportedOncePerRegistration() {
        var h = Harness()
        _ = h.connect()
        #expect(h.send(.registered(name: nil)) == [.report(.registered(name: "me"))])
        #expect(h.send(.registered(name: "me")) == [])
        #expect(h.send(.registered(name: "me #2")) == [.report(.registered(name: "me #2"))])
        _ = h.loseDaemon()
        _ = h.tick(after: .milliseconds(500))
        _ = h.send(.daemonConnected)
        #expect(h.send(.registered(name: "me #2")) == [.report(.registered(name: "me #2"))])
    }

    // MARK: - Resolution failures

    @Test("A resolve timeout retries with a delay growing from 1 s, capped at 30 s")
    func resolveTimeoutRetriesWithCappedBackoff() {
        var h = Harness()
        _ = h.connect()
        #expect(h.send(.browseAdded(Self.a, interfaceIndex: 2)) == [.startResolve(Self.a, interfaceIndex: 2)])
        var delays: [Duration] = []
        for attempt in 1...8 {
            #expect(h.policy.nextDeadline == h.now + Policy.resolveTimeout)
            #expect(h.tick(after: Policy.resolveTimeout - .milliseconds(1)) == [], "attempt \(attempt) abandoned early")
            #expect(h.tick(after: .milliseconds(1)) == [.cancel(.resolve(Self.a))])
            let retryAt = h.policy.nextDeadline!
            delays.append(retryAt - h.now)
            #expect(h.tick(after: retryAt - h.now - .milliseconds(1)) == [])
            #expect(h.tick(after: .milliseconds(1)) == [.startResolve(Self.a, interfaceIndex: 2)])
        }
        #expect(delays == [1, 2, 4, 8, 16, 30, 30, 30].map { Duration.seconds($0) })
        #expect(h.policy.services[Self.a]?.failures == 8)

        // A success resets the count: the next failure waits 1 s again.
        _ = h.send(.resolved(Self.a, hostTarget: "a.local.", interfaceIndex: 2, port: 7001, txt: Self.txt(Self.idA)))
        #expect(Self.reports(h.send(.addressResolved(Self.a, ipv4: "10.77.0.11"))).count == 1)
        #expect(h.policy.services[Self.a]?.failures == 0)
        #expect(Policy.resolveRetryDelay(afterFailures: 1) == .seconds(1))
        #expect(Policy.resolveRetryDelay(afterFailures: 100) == .seconds(30))
    }

    @Test("Resolve and address-query errors fail only that resolution, which is retried")
    func resolverErrorsRetry() {
        var h = Harness()
        _ = h.connect()
        _ = h.send(.browseAdded(Self.a, interfaceIndex: 2))
        #expect(h.send(.operationFailed(.resolve(Self.a), .unknown)) == [.cancel(.resolve(Self.a))])
        #expect(h.policy.connection == .connected)
        #expect(h.tick(after: .seconds(1)) == [.startResolve(Self.a, interfaceIndex: 2)])
        _ = h.send(.resolved(Self.a, hostTarget: "a.local.", interfaceIndex: 2, port: 7001, txt: Self.txt(Self.idA)))
        #expect(h.send(.operationFailed(.addressQuery(Self.a), .unknown)) == [.cancel(.addressQuery(Self.a))])
        #expect(h.policy.nextDeadline == h.now + .seconds(2))
        // An error of a reference no longer in use is dropped with it.
        #expect(h.send(.operationFailed(.addressQuery(Self.a), .unknown)) == [.cancel(.addressQuery(Self.a))])
        #expect(h.policy.nextDeadline == h.now + .seconds(2))
        // A retry that comes due after the instance went away starts nothing.
        _ = h.send(.browseRemoved(Self.a))
        #expect(h.tick(after: .seconds(2)) == [])
    }

    // MARK: - Daemon outages

    @Test("A lost daemon is reported once; reconnections back off 0.5, 1, 2, 4, 5, 5 s")
    func daemonLossBacksOff() {
        var h = Harness()
        #expect(h.policy.nextDeadline == h.now)
        #expect(h.tick() == [.connect])
        #expect(h.tick() == [])  // already connecting
        #expect(h.send(.operationFailed(.register, .unknown)) == [.disconnect, .report(.unavailable(.unknown))])
        var delays: [Duration] = []
        for _ in 1...6 {
            let reconnectAt = h.policy.nextDeadline!
            delays.append(reconnectAt - h.now)
            #expect(h.tick(after: reconnectAt - h.now - .milliseconds(1)) == [])
            #expect(h.tick(after: .milliseconds(1)) == [.connect])
            #expect(h.send(.operationFailed(.browse, .unknown)) == [.disconnect])  // no second unavailable
        }
        #expect(delays == [.milliseconds(500), .seconds(1), .seconds(2), .seconds(4), .seconds(5), .seconds(5)])
        // A late failure of a reference of the dropped connection changes nothing.
        #expect(h.send(.operationFailed(.browse, .unknown)) == [])
        #expect(h.policy.nextDeadline == h.now + .seconds(5))

        _ = h.tick(after: .seconds(5))
        #expect(h.send(.daemonConnected) == [.report(.recovered)])
        #expect(h.policy.nextDeadline == nil)
        // The next outage is a new one, reported again, and its backoff starts over.
        #expect(h.send(.operationFailed(.register, .badParam)) == [.disconnect, .report(.unavailable(.badParam))])
        #expect(h.policy.nextDeadline == h.now + .milliseconds(500))
    }

    @Test("After recovery, peers not seen again within the grace are lost; peers seen again are not")
    func staleGraceAfterRecovery() {
        var h = Harness()
        _ = h.connect()
        _ = h.resolve(Self.a, host: "10.77.0.11", port: 7001, txt: Self.txt(Self.idA))
        _ = h.resolve(Self.b, host: "10.77.0.12", port: 7002, txt: Self.txt(Self.idB))
        _ = h.send(.browseAdded(Self.b, interfaceIndex: 2))  // b's IPv6 double
        // c is still resolving when the daemon goes: it was never reported, so it is simply dropped.
        let c = ServiceKey(name: "peer-c", type: "_peersync._tcp.", domain: "local.")
        _ = h.send(.browseAdded(c, interfaceIndex: 2))

        #expect(h.loseDaemon() == [.disconnect, .report(.unavailable(.unknown))])
        #expect(h.policy.services.keys.sorted() == [Self.a, Self.b])
        #expect(h.policy.services.values.allSatisfy { $0.isStale && $0.presence == 0 && !$0.isResolving })
        // No grace runs while the daemon is away, however long.
        #expect(Self.reports(h.tick(after: .milliseconds(500))) == [])
        _ = h.send(.operationFailed(.browse, .unknown))
        #expect(Self.reports(h.tick(after: .seconds(60))) == [])

        #expect(h.send(.daemonConnected) == [.report(.recovered)])
        let recoveredAt = h.now
        #expect(h.policy.nextDeadline == recoveredAt + Policy.staleGrace)
        #expect(Self.reports(h.resolve(Self.a, host: "10.77.0.11", port: 7001, txt: Self.txt(Self.idA))) == [])
        #expect(h.tick(after: Policy.staleGrace - .milliseconds(1)) == [])
        #expect(h.tick(after: .milliseconds(1)) == [.report(.lost(serviceName: "peer-b"))])
        #expect(h.policy.services.keys.sorted() == [Self.a])
        #expect(h.policy.nextDeadline == nil)
    }

    @Test("A stale peer seen again after the grace is found again; one removed while stale is lost")
    func stalePeerEdgeCases() {
        var h = Harness()
        _ = h.connect()
        _ = h.resolve(Self.a, host: "10.77.0.11", port: 7001, txt: Self.txt(Self.idA))
        _ = h.resolve(Self.b, host: "10.77.0.12", port: 7002, txt: Self.txt(Self.idB))
        _ = h.loseDaemon()
        _ = h.tick(after: .milliseconds(500))
        _ = h.send(.daemonConnected)
        #expect(h.send(.browseRemoved(Self.b)) == [.report(.lost(serviceName: "peer-b"))])
        #expect(h.tick(after: Policy.staleGrace) == [.report(.lost(serviceName: "peer-a"))])
        let again = h.resolve(Self.a, host: "10.77.0.11", port: 7001, txt: Self.txt(Self.idA))
        #expect(Self.reports(again) == [.found(Self.peer(Self.a, Self.idA, host: "10.77.0.11", port: 7001))])
    }

    // MARK: - Deadlines

    @Test("The next deadline is the earliest of reconnection, grace, resolve timeouts and retries")
    func nextDeadline() {
        var h = Harness()
        #expect(h.policy.nextDeadline == Harness.base)  // connect at once
        _ = h.connect()
        #expect(h.policy.nextDeadline == nil)  // connected, nothing in progress
        _ = h.send(.browseAdded(Self.a, interfaceIndex: 2))
        let aTimeout = h.now + Policy.resolveTimeout
        #expect(h.policy.nextDeadline == aTimeout)
        h.now += .seconds(3)
        _ = h.send(.browseAdded(Self.b, interfaceIndex: 2))
        #expect(h.policy.nextDeadline == aTimeout)  // b's timeout is later
        _ = h.send(.operationFailed(.resolve(Self.b), .unknown))
        #expect(h.policy.nextDeadline == h.now + .seconds(1))  // b's retry is earlier
        // The answer to a clears its timeout only when the address is known.
        _ = h.send(.resolved(Self.a, hostTarget: "a.local.", interfaceIndex: 2, port: 7001, txt: Self.txt(Self.idA)))
        _ = h.send(.addressResolved(Self.a, ipv4: "10.77.0.11"))
        #expect(h.policy.nextDeadline == h.now + .seconds(1))
        // Past deadlines stay the answer until a tick handles them (the engine then polls with 0).
        h.now += .seconds(2)
        #expect(h.policy.nextDeadline == h.now - .seconds(1))
        #expect(h.tick() == [.startResolve(Self.b, interfaceIndex: 2)])
        #expect(h.policy.nextDeadline == h.now + Policy.resolveTimeout)
        // During an outage only the reconnection counts.
        _ = h.loseDaemon()
        #expect(h.policy.nextDeadline == h.now + .milliseconds(500))
    }
}
