import Foundation
@_spi(Engine) import PeerSyncCRDT
@testable import PeerSyncReplication
@testable import PeerSyncNetwork
import PeerSyncIdentity
import PeerSyncWire
import Testing

/// The node's own limit decisions, without sockets or clocks: which inbound connections it
/// takes (``InboundAdmission``) and which addresses it dials when (``DialScheduler``).
@Suite("Limits: inbound admission and dial scheduling")
struct LimitsTests {
    let t0 = ContinuousClock.now

    static func limits(total: Int = 256, perAddress: Int = 16, dials: Int = 8, perHost: Int = 1) -> SyncLimits {
        var limits = SyncLimits()
        limits.inboundConnections = total
        limits.inboundConnectionsPerAddress = perAddress
        limits.concurrentDials = dials
        limits.concurrentDialsPerHost = perHost
        return limits
    }

    static func scheduler(dials: Int = 8, perHost: Int = 1) -> DialScheduler {
        DialScheduler(settings: .init(limits: limits(dials: dials, perHost: perHost), timing: SyncTiming()))
    }

    static func address(_ host: Int, _ port: UInt16 = 7946) -> PeerAddress { PeerAddress(host: "10.0.0.\(host)", port: port) }

    // MARK: - Inbound admission

    @Test("defaults: 256 connections, 16 per address, 8 dials, 1 per host, rejected peers redialed from 5 s up to 5 min")
    func defaults() {
        let limits = SyncLimits()
        #expect(limits.inboundConnections == 256)
        #expect(limits.inboundConnectionsPerAddress == 16)
        #expect(limits.concurrentDials == 8)
        #expect(limits.concurrentDialsPerHost == 1)
        #expect(limits.rejectedDialBackoff == Backoff(first: .seconds(5), max: .seconds(300)))
        #expect(limits.sessions == 128)
        #expect(SyncTiming().handshakeTimeout == .seconds(10))
    }

    @Test("1,000 connections from one address: the first 16 are admitted, the rest refused, and one report is due")
    func perAddress() {
        var admission = InboundAdmission(limits: Self.limits())
        var admitted = 0
        var reports: [InboundAdmission.Report] = []
        for i in 0..<1_000 {
            let (refusal, report) = admission.arrived(from: "10.0.0.9", now: t0 + .milliseconds(i))
            if refusal == nil { admitted += 1 } else { #expect(refusal == .perAddress) }
            if let report { reports.append(report) }
        }
        #expect(admitted == 16)
        #expect(admission.refusedOverAddress == 984)
        #expect(admission.refusedOverTotal == 0)
        // One second of refusals: one report (the first), not 984 lines.
        #expect(reports == [InboundAdmission.Report(overTotal: 0, overAddress: 1, lastAddress: "10.0.0.9")])
        // Another address is not affected.
        #expect(admission.arrived(from: "10.0.0.2", now: t0 + .seconds(1)).refusal == nil)
        #expect(admission.openCount == 17)
    }

    @Test("the total limit holds across addresses; a closed connection frees its place")
    func total() {
        var admission = InboundAdmission(limits: Self.limits(total: 3, perAddress: 2))
        #expect(admission.arrived(from: "a", now: t0).refusal == nil)
        #expect(admission.arrived(from: "a", now: t0).refusal == nil)
        #expect(admission.arrived(from: "a", now: t0).refusal == .perAddress)
        #expect(admission.arrived(from: "b", now: t0).refusal == nil)
        #expect(admission.arrived(from: "c", now: t0).refusal == .total)
        admission.closed(from: "a")
        #expect(admission.open["a"] == 1)
        #expect(admission.arrived(from: "c", now: t0).refusal == nil)
        #expect(admission.arrived(from: "b", now: t0).refusal == .total)
        #expect((admission.refusedOverTotal, admission.refusedOverAddress) == (2, 1))
        // A close reported for an address with nothing open changes nothing.
        admission.closed(from: "nobody")
        #expect(admission.openCount == 3)
    }

    @Test("refusals are reported at most once per 10 s, with the counts since the previous report")
    func rateLimitedReports() {
        var admission = InboundAdmission(limits: Self.limits(total: 1, perAddress: 1))
        _ = admission.arrived(from: "a", now: t0)
        #expect(admission.arrived(from: "a", now: t0).report == .init(overTotal: 1, overAddress: 0, lastAddress: "a"))
        for second in 1..<10 { #expect(admission.arrived(from: "b", now: t0 + .seconds(second)).report == nil) }
        #expect(admission.arrived(from: "c", now: t0 + .seconds(10)).report == .init(overTotal: 10, overAddress: 0, lastAddress: "c"))
        #expect(admission.arrived(from: "d", now: t0 + .seconds(11)).report == nil)
        #expect(admission.refusedOverTotal == 12)
    }

    @Test("limits below 1 are taken as 1")
    func atLeastOne() {
        var admission = InboundAdmission(limits: Self.limits(total: 0, perAddress: -5))
        #expect(admission.arrived(from: "a", now: t0).refusal == nil)
        #expect(admission.arrived(from: "b", now: t0).refusal == .total)
        var scheduler = DialScheduler(settings: .init(limits: Self.limits(dials: 0, perHost: 0), timing: SyncTiming()))
        scheduler.add(Self.address(1), source: .configured, now: t0)
        scheduler.add(Self.address(2), source: .configured, now: t0)
        #expect(scheduler.due(now: t0).count == 1)
    }

    // MARK: - Dial scheduling

    @Test("at most N attempts at once, one per host; an established session frees its slot")
    func concurrency() {
        var scheduler = Self.scheduler(dials: 3)
        scheduler.add(Self.address(1), source: .configured, now: t0)
        scheduler.add(Self.address(1, 7947), source: .configured, now: t0)  // a second port on host 1
        for host in 2...4 { scheduler.add(Self.address(host), source: .configured, now: t0) }
        let first = scheduler.due(now: t0)
        #expect(first == [Self.address(1), Self.address(2), Self.address(3)])
        #expect(scheduler.due(now: t0).isEmpty)
        #expect(scheduler.nextWakeup() == nil, "no slot free: only an attempt's end wakes the scheduler")
        scheduler.established(Self.address(1))
        // Host 1 is free again (established sessions hold no slot): its second port may go.
        #expect(scheduler.due(now: t0) == [Self.address(1, 7947)])
        scheduler.ended(Self.address(2), .failed, now: t0, jitter: 0)
        #expect(scheduler.due(now: t0) == [Self.address(4)])
        #expect(scheduler.dialing == 3)
        #expect(scheduler.peak == 3)
        #expect(scheduler.attempts == 5)
    }

    @Test("ordinary failures back off 0.2 s doubling to 5 s; a session of 10 s resets it")
    func ordinaryBackoff() {
        var scheduler = Self.scheduler()
        let peer = Self.address(1)
        scheduler.add(peer, source: .configured, now: t0)
        var now = t0
        var delays: [Duration] = []
        for _ in 0..<7 {
            #expect(scheduler.due(now: now) == [peer])
            scheduler.ended(peer, .failed, now: now, jitter: 0)
            guard let next = scheduler.nextWakeup() else { Issue.record("no wake-up"); return }
            delays.append(next - now)
            #expect(scheduler.due(now: next - .milliseconds(1)).isEmpty)
            now = next
        }
        #expect(delays == [.milliseconds(200), .milliseconds(400), .milliseconds(800), .milliseconds(1600), .milliseconds(3200),
                           .seconds(5), .seconds(5)])
        // A session shorter than 10 s does not reset it.
        #expect(scheduler.due(now: now) == [peer])
        scheduler.established(peer)
        scheduler.ended(peer, .established(lasted: .seconds(2)), now: now, jitter: 0)
        #expect(scheduler.nextWakeup() == now + .seconds(5))
        now = now + .seconds(5)
        // One of 10 s does.
        #expect(scheduler.due(now: now) == [peer])
        scheduler.established(peer)
        scheduler.ended(peer, .established(lasted: .seconds(30)), now: now, jitter: 0)
        #expect(scheduler.nextWakeup() == now + .milliseconds(200))
    }

    @Test("rejected sessions back off 5 s doubling up to 5 minutes; jitter stays within ±20 %")
    func rejectedBackoff() {
        var scheduler = Self.scheduler()
        let forged = Self.address(1)
        scheduler.add(forged, source: .discovered(serviceName: "forged"), now: t0)
        var now = t0
        var delays: [Duration] = []
        for _ in 0..<9 {
            #expect(scheduler.due(now: now) == [forged])
            scheduler.ended(forged, .rejected, now: now, jitter: 0)
            let next = scheduler.nextWakeup()!
            delays.append(next - now)
            now = next
        }
        #expect(delays == [5, 10, 20, 40, 80, 160, 300, 300, 300].map { Duration.seconds($0) })
        #expect(scheduler.rejectedTargets == 1)
        _ = scheduler.due(now: now)
        scheduler.ended(forged, .rejected, now: now, jitter: 1)
        #expect(scheduler.nextWakeup()! - now == .seconds(360))
        _ = scheduler.due(now: now + .seconds(360))
        scheduler.ended(forged, .rejected, now: now, jitter: -1)
        #expect(scheduler.nextWakeup()! - now == .seconds(240))
    }

    @Test("a discovered address at a closed port backs off like a refused one: 0.2 s doubling on past 5 s to 5 min, kept across re-announcing")
    func closedPortBackoff() {
        var scheduler = Self.scheduler()
        let forged = Self.address(1, 9999)
        let name = DialScheduler.Source.discovered(serviceName: "forged")
        scheduler.add(forged, source: name, now: t0)
        var now = t0
        var delays: [Duration] = []
        for _ in 0..<13 {
            #expect(scheduler.due(now: now) == [forged])
            scheduler.ended(forged, .failed, now: now, jitter: 0)  // connection refused
            let next = scheduler.nextWakeup()!
            delays.append(next - now)
            now = next
        }
        #expect(delays == [200, 400, 800, 1_600, 3_200, 6_400, 12_800, 25_600, 51_200, 102_400, 204_800, 300_000, 300_000]
            .map { Duration.milliseconds($0) })
        // Withdrawn and announced again: its backoff is remembered, as a refused address's is.
        _ = scheduler.due(now: now)
        scheduler.ended(forged, .failed, now: now, jitter: 0)
        scheduler.remove(name)
        #expect(scheduler.targets.isEmpty)
        scheduler.add(forged, source: .discovered(serviceName: "forged again"), now: now + .seconds(1))
        #expect(scheduler.due(now: now + .seconds(1)).isEmpty, "re-announcing reset the backoff")
        #expect(scheduler.due(now: now + .seconds(300)) == [forged])

        // 100 closed ports: in 10 minutes each is tried about a dozen times, not every 5 s (120 times).
        var many = Self.scheduler()
        for i in 0..<100 { many.add(Self.address(3, UInt16(8000 + i)), source: .discovered(serviceName: "closed \(i)"), now: t0) }
        var clock = t0
        while clock < t0 + .seconds(600) {
            for address in many.due(now: clock) { many.ended(address, .failed, now: clock, jitter: 0) }
            clock = max(clock + .milliseconds(100), many.nextWakeup() ?? clock)
        }
        #expect(many.attempts <= 100 * 13, "attempts: \(many.attempts)")

        // An address that once had a session, and a configured one, keep the ordinary 5 s cap.
        for source in [DialScheduler.Source.discovered(serviceName: "real"), .configured] {
            var other = Self.scheduler()
            let peer = Self.address(2)
            other.add(peer, source: source, now: t0)
            var at = t0
            if source != .configured {
                _ = other.due(now: at)
                other.established(peer)
                other.ended(peer, .established(lasted: .seconds(30)), now: at, jitter: 0)
                at = other.nextWakeup()!
            }
            for _ in 0..<10 {
                #expect(other.due(now: at) == [peer])
                other.ended(peer, .failed, now: at, jitter: 0)
                let next = other.nextWakeup()!
                #expect(next - at <= .seconds(5))
                at = next
            }
        }
    }

    @Test("100 forged adverts on two hosts cannot starve a real peer: it is dialed at once, and the forged ones cost a few attempts a minute")
    func forgedAdverts() {
        var scheduler = Self.scheduler(dials: 4)
        // The forged adverts arrive first, all due at once.
        for i in 0..<100 {
            scheduler.add(Self.address(i < 50 ? 3 : 4, UInt16(8000 + i)), source: .discovered(serviceName: "forged \(i)"), now: t0)
        }
        let real = Self.address(2)
        scheduler.add(real, source: .discovered(serviceName: "real"), now: t0 + .milliseconds(5))
        let first = scheduler.due(now: t0 + .milliseconds(5))
        #expect(first.contains(real), "the real peer waits behind forged adverts: \(first)")
        #expect(first.count == 3, "one attempt per host: \(first)")
        scheduler.established(real)
        // Simulate a minute: every forged attempt is rejected after 10 s (a black hole: the
        // handshake timeout) or at once (another group's node).
        var now = t0 + .milliseconds(5)
        var attemptsAt: [PeerAddress: Int] = [:]
        var inFlight = first.filter { $0 != real }
        for address in inFlight { attemptsAt[address, default: 0] += 1 }
        while now < t0 + .seconds(60) {
            now = now + .seconds(1)
            for address in inFlight { scheduler.ended(address, .rejected, now: now, jitter: 0) }
            inFlight = scheduler.due(now: now)
            #expect(scheduler.dialing <= 4)
            for address in inFlight { attemptsAt[address, default: 0] += 1 }
        }
        #expect(scheduler.peak <= 4)
        #expect(attemptsAt.values.allSatisfy { $0 <= 4 }, "a forged advert was dialed more than 4 times in a minute")
        #expect(scheduler.rejectedTargets >= 50)
        // The real peer's session ends: it goes before every forged advert (it had a session).
        scheduler.ended(real, .established(lasted: .seconds(60)), now: now, jitter: 0)
        for address in inFlight { scheduler.ended(address, .rejected, now: now, jitter: 0) }
        let next = now + .seconds(400)
        #expect(scheduler.due(now: next).first == real)
    }

    @Test("static peers go before discovered ones; withdrawn adverts are dropped once their attempt ends")
    func sourcesAndWithdrawal() {
        var scheduler = Self.scheduler(dials: 1, perHost: 1)
        scheduler.add(Self.address(1), source: .discovered(serviceName: "one"), now: t0)
        scheduler.add(Self.address(2), source: .configured, now: t0 + .seconds(1))
        #expect(scheduler.due(now: t0 + .seconds(1)) == [Self.address(2)])
        scheduler.ended(Self.address(2), .failed, now: t0 + .seconds(1), jitter: 0)
        #expect(scheduler.due(now: t0 + .seconds(1)) == [Self.address(1)])
        // Withdrawn while dialing: kept until the attempt ends, then dropped.
        scheduler.remove(.discovered(serviceName: "one"))
        #expect(scheduler.targets[Self.address(1)] != nil)
        scheduler.ended(Self.address(1), .failed, now: t0 + .seconds(2), jitter: 0)
        #expect(scheduler.targets[Self.address(1)] == nil)
        // Withdrawn while waiting: dropped at once. A static peer with the same address stays.
        scheduler.add(Self.address(2), source: .discovered(serviceName: "two"), now: t0 + .seconds(2))
        scheduler.add(Self.address(5), source: .discovered(serviceName: "five"), now: t0 + .seconds(2))
        scheduler.remove(.discovered(serviceName: "two"))
        scheduler.remove(.discovered(serviceName: "five"))
        #expect(scheduler.targets.keys.sorted { $0.description < $1.description } == [Self.address(2)])
        #expect(scheduler.targets[Self.address(2)]?.sources == [.configured])
    }

    @Test("a service found again keeps its backoff; found at a new address it leaves the old one")
    func foundAgain() {
        var scheduler = Self.scheduler()
        let name = DialScheduler.Source.discovered(serviceName: "node")
        scheduler.add(Self.address(1), source: name, now: t0)
        _ = scheduler.due(now: t0)
        scheduler.ended(Self.address(1), .rejected, now: t0, jitter: 0)
        scheduler.add(Self.address(1), source: name, now: t0 + .seconds(1))
        #expect(scheduler.due(now: t0 + .seconds(1)).isEmpty, "re-announcing reset the backoff")
        #expect(scheduler.targets[Self.address(1)]?.rejections == 1)
        scheduler.add(Self.address(2), source: name, now: t0 + .seconds(1))
        #expect(scheduler.targets[Self.address(1)] == nil)
        #expect(scheduler.due(now: t0 + .seconds(1)) == [Self.address(2)])
    }

    @Test("a configured peer that refuses or times out is retried within the ordinary backoff (≤ 5 s), not minutes")
    func configuredPeerRetriedSoon() {
        var scheduler = Self.scheduler()
        let peer = Self.address(4)
        scheduler.add(peer, source: .configured, now: t0)
        var now = t0
        for _ in 0..<6 {
            #expect(scheduler.due(now: now) == [peer])
            scheduler.ended(peer, .rejected, now: now, jitter: 0)
            let next = scheduler.nextWakeup()!
            #expect(next - now <= .seconds(5))
            now = next
        }
    }

    @Test("a configured peer that refuses this node at admission (a spent invite, this device removed) is redialed after 5 s doubling to 5 min")
    func configuredPeerRefusingBacksOff() {
        var scheduler = Self.scheduler()
        let peer = Self.address(4)
        scheduler.add(peer, source: .configured, now: t0)
        var now = t0
        var waits: [Duration] = []
        for _ in 0..<9 {
            #expect(scheduler.due(now: now) == [peer])
            scheduler.ended(peer, .refusedByPeer, now: now, jitter: 0)
            let next = scheduler.nextWakeup()!
            #expect(scheduler.due(now: next - .milliseconds(1)).isEmpty)
            waits.append(next - now)
            now = next
        }
        #expect(waits == [5, 10, 20, 40, 80, 160, 300, 300, 300].map { Duration.seconds($0) })
        #expect(scheduler.rejectedTargets == 1)
        // A session at last: the next refusal starts from 5 s again.
        #expect(scheduler.due(now: now) == [peer])
        scheduler.established(peer)
        scheduler.ended(peer, .established(lasted: .seconds(60)), now: now, jitter: 0)
        now = scheduler.nextWakeup()!
        #expect(scheduler.due(now: now) == [peer])
        scheduler.ended(peer, .refusedByPeer, now: now, jitter: 0)
        #expect(scheduler.nextWakeup()! - now == .seconds(5))
    }

    @Test("a peer refused as a removed device is not dialed again at that address; an advert naming another replica there is, after the backoff")
    func removedDeviceNotRedialed() {
        var scheduler = Self.scheduler()
        let peer = Self.address(4)
        scheduler.add(peer, source: .configured, now: t0)
        #expect(scheduler.due(now: t0) == [peer])
        let givenUp = scheduler.ended(peer, .removedDevice, now: t0, jitter: 0)
        #expect(givenUp)
        #expect(scheduler.targets.isEmpty)
        #expect(scheduler.nextWakeup() == nil)
        // Configured again (or found again with no replica named): still not dialed.
        let configuredAgain = scheduler.add(peer, source: .configured, now: t0 + .seconds(1))
        #expect(!configuredAgain)
        let foundAgain = scheduler.add(peer, source: .discovered(serviceName: "d"), now: t0 + .seconds(1))
        #expect(!foundAgain)
        #expect(scheduler.due(now: t0 + .seconds(3_600)).isEmpty)
        // An advert naming a replica no removed device claimed: another device is there now,
        // dialed once the rejected backoff (5 s) is over.
        let anotherDevice = scheduler.add(peer, source: .discovered(serviceName: "e"), replica: ReplicaID(high: 9, low: 9), now: t0 + .seconds(1))
        #expect(anotherDevice)
        #expect(scheduler.due(now: t0 + .seconds(4)).isEmpty)
        #expect(scheduler.due(now: t0 + .seconds(5)) == [peer])
    }

    @Test("an address whose replica a removed device claimed is never dialed: from its advert, or learned from a session there")
    func removedReplicasNotDialed() {
        var scheduler = Self.scheduler()
        let (r1, r2, r3) = (ReplicaID(high: 1, low: 1), ReplicaID(high: 2, low: 2), ReplicaID(high: 3, low: 3))
        let (advert, other, configured) = (Self.address(1), Self.address(2), Self.address(3))
        let droppedFirst = scheduler.setRemoved(replicas: [r1], devices: [])
        #expect(droppedFirst.isEmpty)
        let removedAdvert = scheduler.add(advert, source: .discovered(serviceName: "removed"), replica: r1, now: t0)
        #expect(!removedAdvert)
        let otherAdvert = scheduler.add(other, source: .discovered(serviceName: "other"), replica: r2, now: t0)
        #expect(otherAdvert)
        scheduler.add(configured, source: .configured, now: t0)
        #expect(Set(scheduler.due(now: t0)) == [other, configured])
        // A session at the configured address showed r3 there; both now wait to be redialed.
        scheduler.learned(r3, device: nil, at: configured)
        scheduler.ended(configured, .established(lasted: .seconds(60)), now: t0, jitter: 0)
        scheduler.ended(other, .failed, now: t0, jitter: 0)
        // The roster removes the devices of r2 and r3: neither address is dialed again.
        let dropped = scheduler.setRemoved(replicas: [r1, r2, r3], devices: [])
        #expect(dropped == [other, configured].sorted { $0.description < $1.description })
        #expect(scheduler.targets.isEmpty)
        #expect(scheduler.due(now: t0 + .seconds(3_600)).isEmpty)
        // An attempt running when the removal arrived is given up when it ends, however it ended.
        let running = Self.address(5)
        scheduler.add(running, source: .discovered(serviceName: "running"), replica: ReplicaID(high: 5, low: 5), now: t0)
        #expect(scheduler.due(now: t0) == [running])
        let droppedRunning = scheduler.setRemoved(replicas: [r1, r2, r3, ReplicaID(high: 5, low: 5)], devices: [])
        #expect(droppedRunning.isEmpty)
        let runningGivenUp = scheduler.ended(running, .failed, now: t0, jitter: 0)
        #expect(runningGivenUp)
        #expect(scheduler.targets.isEmpty)
    }

    @Test("an address where a session authenticated a device that is then removed is not dialed again, even if its replica's claim never arrived")
    func removedDeviceNotDialed() {
        var scheduler = Self.scheduler()
        let device = DeviceKey.generate().deviceID
        let (waiting, running) = (Self.address(1), Self.address(2))
        scheduler.add(waiting, source: .configured, now: t0)
        scheduler.add(running, source: .configured, now: t0)
        #expect(Set(scheduler.due(now: t0)) == [waiting, running])
        // A session at each showed the device (one replica each; no claim of either is known).
        scheduler.learned(ReplicaID(high: 7, low: 7), device: device, at: waiting)
        scheduler.learned(ReplicaID(high: 8, low: 8), device: device, at: running)
        scheduler.ended(waiting, .established(lasted: .seconds(60)), now: t0, jitter: 0)
        let dropped = scheduler.setRemoved(replicas: [], devices: [device])
        #expect(dropped == [waiting])
        let givenUp = scheduler.ended(running, .failed, now: t0, jitter: 0)
        #expect(givenUp)
        #expect(scheduler.targets.isEmpty)
    }

    @Test("withdrawn and announced again, a refused address keeps its backoff")
    func reannounced() {
        var scheduler = Self.scheduler()
        let forged = Self.address(3, 9000)
        scheduler.add(forged, source: .discovered(serviceName: "forged"), now: t0)
        _ = scheduler.due(now: t0)
        scheduler.ended(forged, .rejected, now: t0, jitter: 0)
        scheduler.remove(.discovered(serviceName: "forged"))
        #expect(scheduler.targets.isEmpty)
        scheduler.add(forged, source: .discovered(serviceName: "forged again"), now: t0 + .seconds(1))
        #expect(scheduler.due(now: t0 + .seconds(1)).isEmpty)
        #expect(scheduler.due(now: t0 + .seconds(5)) == [forged])
        scheduler.ended(forged, .rejected, now: t0 + .seconds(5), jitter: 0)
        #expect(scheduler.nextWakeup() == t0 + .seconds(15), "the second rejection waits 10 s")
    }

    @Test("once an address on a host was refused, the host's other new addresses wait behind a real peer found later")
    func hostReputation() {
        var scheduler = Self.scheduler(dials: 1)
        for i in 0..<5 { scheduler.add(Self.address(3, UInt16(9000 + i)), source: .discovered(serviceName: "forged \(i)"), now: t0) }
        #expect(scheduler.due(now: t0) == [Self.address(3, 9000)])
        let real = Self.address(2)
        scheduler.add(real, source: .discovered(serviceName: "real"), now: t0 + .seconds(1))
        scheduler.ended(Self.address(3, 9000), .rejected, now: t0 + .seconds(10), jitter: 0)
        #expect(scheduler.hostRejections["10.0.0.3"] == 1)
        #expect(scheduler.due(now: t0 + .seconds(10)) == [real])
        scheduler.established(real)
        scheduler.ended(real, .established(lasted: .seconds(60)), now: t0 + .seconds(70), jitter: 0)
        // A session established with a host clears its record.
        _ = scheduler.due(now: t0 + .seconds(70))
        scheduler.ended(Self.address(3, 9001), .established(lasted: .seconds(1)), now: t0 + .seconds(71), jitter: 0)
        #expect(scheduler.hostRejections["10.0.0.3"] == nil)
    }

    @Test("a session the other way round, or a duplicate, waits 5 s without counting as a failure; stopping drops")
    func elsewhereAndStopped() {
        var scheduler = Self.scheduler()
        let peer = Self.address(1)
        scheduler.add(peer, source: .configured, now: t0)
        _ = scheduler.due(now: t0)
        scheduler.ended(peer, .connectedElsewhere, now: t0, jitter: 0.5)
        #expect(scheduler.nextWakeup() == t0 + .seconds(5))
        #expect(scheduler.targets[peer]?.failures == 0)
        _ = scheduler.due(now: t0 + .seconds(5))
        scheduler.ended(peer, .stopped, now: t0 + .seconds(5), jitter: 0)
        #expect(scheduler.targets.isEmpty)
    }

    @Test("how a dialed session ended decides its backoff")
    func outcomes() {
        typealias O = DialScheduler.Outcome
        let lasted = Duration.seconds(3)
        func outcome(_ reason: SessionEndReason, established: Bool = false) -> O {
            O(reason: reason, established: established, lasted: lasted)
        }
        #expect(outcome(.unreachable(detail: "refused")) == .failed)
        #expect(outcome(.connectionLost(detail: "")) == .failed)
        #expect(outcome(.connectionLost(detail: ""), established: true) == .established(lasted: lasted))
        #expect(outcome(.handshakeFailed(detail: "timeout")) == .rejected)
        #expect(outcome(.peerClosed(.notAdmitted, detail: "another group")) == .refusedByPeer)
        #expect(outcome(.peerClosed(.notAdmitted, detail: "invite 3f2a9c01 was already used by K4QZ")) == .refusedByPeer)
        #expect(outcome(.peerClosed(.protocolVersion, detail: "")) == .refusedByPeer)
        #expect(outcome(.peerClosed(.clockSkew, detail: "")) == .rejected)
        #expect(outcome(.refused(.notAdmitted, detail: "the peer belongs to another sync group")) == .rejected)
        #expect(outcome(.peerClosed(.deviceRemoved, detail: ""), established: true) == .refusedByPeer)
        #expect(outcome(.refused(.protocolVersion, detail: "")) == .rejected)
        #expect(outcome(.refused(.deviceRemoved, detail: "device K4QZ was removed from the group by Ana")) == .removedDevice)
        #expect(outcome(.refused(.deviceRemoved, detail: ""), established: true) == .removedDevice)
        #expect(outcome(.refused(.clockSkew, detail: "")) == .rejected)
        #expect(outcome(.refused(.timeout, detail: "no hello within 10 s")) == .rejected)
        #expect(outcome(.refused(.timeout, detail: "no frame for 5 s"), established: true) == .established(lasted: lasted))
        #expect(outcome(.peerClosed(.overloaded, detail: "")) == .failed)
        #expect(outcome(.peerClosed(.shuttingDown, detail: ""), established: true) == .established(lasted: lasted))
        #expect(outcome(.duplicate) == .connectedElsewhere)
        #expect(outcome(.peerClosed(.duplicateConnection, detail: "")) == .connectedElsewhere)
        #expect(outcome(.localShutdown) == .stopped)
        #expect(outcome(.storageFailed(detail: "disk full"), established: true) == .established(lasted: lasted))
    }
}
