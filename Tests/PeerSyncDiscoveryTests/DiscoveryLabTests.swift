import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Discovery between real avahi daemons, each in its own network namespace (Scripts/netlab.sh).
/// Nothing here touches the machine's own network: the lab's namespaces are joined by a bridge in
/// a namespace of its own, and every daemon is confined to its host's lab0 link.
@Suite(
    "Discovery in a network-namespace lab", .ownThread, .serialized,
    .enabled(if: LabEnvironment.isUsable, "needs root, avahi-daemon, dbus-daemon, ip, unshare, setsid")
)
struct DiscoveryLabTests {
    static let timeToFind: Duration = .seconds(30)

    @Test("Three hosts in one group find each other", .timeLimit(.minutes(10)))
    func threeHostsFindEachOther() throws {
        let lab = Lab()
        defer { lab.downAndVerify() }
        try lab.up(3)
        let probes = try (1...3).map { host in
            try Probe(lab: lab, host: host, name: "peer-h\(host)", port: UInt16(7000 + host), group: "c0ffee0123456789")
        }
        defer { probes.forEach { $0.stop() } }

        // Each probe's own "registered" line too: avahi may announce (and the others resolve) the
        // service before it tells the registering client, which a loaded CI machine showed once.
        let everyoneFound = waitUntil(probes, timeout: Self.timeToFind) {
            probes.allSatisfy { probe in
                !probe.events("registered").isEmpty
                    && probes.allSatisfy { other in other === probe || !probe.found(other).isEmpty }
            }
        }
        #expect(everyoneFound, "not every probe found the other two: \(probes.map { "h\($0.host): \($0.events)" })")

        var registerToFound: [Double] = []
        var startToFound: [Double] = []
        for probe in probes {
            for other in probes where other !== probe {
                let found = try #require(probe.found(other).first, "h\(probe.host) did not find h\(other.host)")
                #expect(found.host == lab.address(ofHost: other.host))
                #expect(found.port == other.port)
                #expect(found.name == other.name)
                #expect(found.group == "c0ffee0123456789")
                #expect(found.version == 1)
                #expect(probe.found(other).count == 1, "h\(probe.host) reported h\(other.host) more than once")
                let registered = try #require(other.events("registered").first, "h\(other.host) never registered")
                let started = try #require(other.events("start").first)
                registerToFound.append((Double(found.t) - Double(registered.t)) / 1e6)
                startToFound.append((Double(found.t) - Double(started.t)) / 1e6)
            }
            let strangers = probe.events("found").filter { event in !probes.contains { $0.replica.description == event.replica } }
            #expect(strangers.isEmpty, "h\(probe.host) found unknown peers: \(strangers)")
            #expect(probe.events("unavailable").isEmpty)
        }
        print("discovery timing, ms (peer's .registered → .found on the others): "
              + registerToFound.map { String(format: "%.0f", $0) }.joined(separator: " "))
        print("discovery timing, ms (peer's process start → .found on the others): "
              + startToFound.map { String(format: "%.0f", $0) }.joined(separator: " "))

        for probe in probes {
            #expect(probe.stop() == 0, "probe h\(probe.host) did not exit cleanly on SIGTERM")
            #expect(probe.events.last?.event == "stopped")
            #expect(probe.events.last?.exited == true, "h\(probe.host): stopAndWait() returned before the thread finished")
            probe.checkInvariants()
        }
    }

    @Test("A probe of another group is seen, and its TXT holds only the opaque tag", .timeLimit(.minutes(10)))
    func otherGroupIsSeenWithOpaqueTagOnly() throws {
        let lab = Lab()
        defer { lab.downAndVerify() }
        try lab.up(2)
        // The group tags stand for groups a person would call "Night shift" and "Day shift";
        // only the tags ever reach the network.
        let night = try Probe(lab: lab, host: 1, name: "peer-h1", port: 7001, group: "5f1d3a9e0c7b2468")
        let day = try Probe(lab: lab, host: 2, name: "peer-h2", port: 7002, group: "a7c3e5f90b1d2846")
        let probes = [night, day]
        defer { probes.forEach { $0.stop() } }

        let seen = waitUntil(probes, timeout: Self.timeToFind) { !night.found(day).isEmpty && !day.found(night).isEmpty }
        #expect(seen, "probes of different groups did not see each other: \(probes.map(\.events))")
        #expect(night.found(day).first?.group == "a7c3e5f90b1d2846")
        #expect(day.found(night).first?.group == "5f1d3a9e0c7b2468")

        // What any host on the LAN sees: avahi-browse's resolved record of peer-h2, from h1.
        let browse = try lab.run(
            ["exec", "h1", "avahi-browse", "--resolve", "--parsable", "--terminate", "--no-db-lookup", "_peersync._tcp"],
            timeout: .seconds(20))
        #expect(browse.status == 0)
        // Parsable lines: =;IFACE;PROTO;NAME;TYPE;DOMAIN;HOSTNAME;ADDRESS;PORT;TXT
        var resolved: [[String]] = []
        for line in browse.output.split(separator: "\n") {
            let fields = line.split(separator: ";", omittingEmptySubsequences: false).map(String.init)
            if fields.count >= 10 && fields[0] == "=" && fields[3] == "peer-h2" { resolved.append(fields) }
        }
        let record = try #require(resolved.first, "avahi-browse did not resolve peer-h2:\n\(browse.output)")
        #expect(record[7] == "10.77.0.12")
        #expect(record[8] == "7002")
        let txt = record[9]
        let entries = txt.split(separator: " ").map { $0.trimmingCharacters(in: CharacterSet(charactersIn: "\"")) }
        let keys = Set(entries.compactMap { $0.split(separator: "=", maxSplits: 1).first.map(String.init) })
        #expect(keys == ["v", "id", "g"], "TXT must hold exactly v, id and g: \(txt)")
        #expect(entries.contains("g=a7c3e5f90b1d2846"))
        #expect(entries.contains("id=\(day.replica.description)"))
        #expect(entries.contains("v=1"))
        #expect(!browse.output.localizedCaseInsensitiveContains("shift"), "a group name reached the network")

        for probe in probes {
            #expect(probe.stop() == 0)
            probe.checkInvariants()
        }
    }

    @Test("Without a reachable daemon a probe says so once, keeps running, and recovers", .timeLimit(.minutes(10)))
    func unreachableDaemonIsReportedOnceAndRecovered() throws {
        let lab = Lab()
        defer { lab.downAndVerify() }
        try lab.up(2)
        try lab.stopAvahi(1)

        // h1: D-Bus up but no avahi. "nobus": in h1 too, but its D-Bus address leads nowhere.
        let waiting = try Probe(lab: lab, host: 1, name: "peer-h1", port: 7001, group: "0123456789abcdef")
        let nobus = try Probe(
            lab: lab, host: 1, name: "peer-nobus", port: 7009, group: "0123456789abcdef",
            wrapper: ["env", "DBUS_SYSTEM_BUS_ADDRESS=unix:path=/run/peersync-no-such-bus"])
        let other = try Probe(lab: lab, host: 2, name: "peer-h2", port: 7002, group: "0123456789abcdef")
        let probes = [waiting, nobus, other]
        defer { probes.forEach { $0.stop() } }

        let reported = waitUntil(probes, timeout: .seconds(15)) {
            !waiting.events("unavailable").isEmpty && !nobus.events("unavailable").isEmpty
        }
        #expect(reported, "no .unavailable: \(waiting.events) / \(nobus.events)")
        // Several retries happen in this time (backoff 0.5 s, 1 s, 2 s, ...); none is reported again.
        observe(probes, for: .seconds(4))
        for probe in [waiting, nobus] {
            #expect(probe.events("unavailable").count == 1, "h\(probe.host) \(probe.name): \(probe.events)")
            let unavailable = try #require(probe.events("unavailable").first)
            #expect(unavailable.code == -65537)
            #expect(unavailable.error?.contains("no avahi daemon reachable") == true)
            #expect(probe.events("registered").isEmpty)
            #expect(probe.isRunning, "\(probe.name) exited while the daemon was unreachable")
        }

        // The daemon appears: the waiting probe registers and browses without a restart.
        let daemonStarted = monotonicNanoseconds()
        try lab.startAvahi(1)
        let recovered = waitUntil(probes, timeout: Self.timeToFind) {
            !waiting.events("recovered").isEmpty && !waiting.events("registered").isEmpty
                && !waiting.found(other).isEmpty && !other.found(waiting).isEmpty
        }
        #expect(recovered, "h1 did not recover: \(waiting.events); h2: \(other.events)")
        if let found = other.found(waiting).first {
            print("discovery timing, ms (avahi started on h1 → h2 finds h1): "
                  + String(format: "%.0f", (Double(found.t) - Double(daemonStarted)) / 1e6))
        }
        #expect(waiting.events.map(\.event).prefix(3) == ["start", "unavailable", "recovered"])
        #expect(nobus.events("unavailable").count == 1)
        #expect(nobus.events("recovered").isEmpty)
        #expect(other.events("unavailable").isEmpty)

        for probe in probes {
            #expect(probe.stop() == 0)
            probe.checkInvariants()
        }
    }

    @Test("A host whose daemon restarts becomes discoverable again without restarting its probe", .timeLimit(.minutes(10)))
    func restartedDaemonIsDiscoverableAgain() throws {
        let lab = Lab()
        defer { lab.downAndVerify() }
        try lab.up(3)
        let probes = try (1...3).map { host in
            try Probe(lab: lab, host: host, name: "peer-h\(host)", port: UInt16(7000 + host), group: "fedcba9876543210")
        }
        defer { probes.forEach { $0.stop() } }
        let (restarting, others) = (probes[0], Array(probes[1...]))

        let everyoneFound = waitUntil(probes, timeout: Self.timeToFind) {
            probes.allSatisfy { probe in probes.allSatisfy { other in other === probe || !probe.found(other).isEmpty } }
        }
        #expect(everyoneFound, "initial discovery failed: \(probes.map(\.events))")

        try lab.stopAvahi(1)
        let noticed = waitUntil(probes, timeout: .seconds(20)) {
            restarting.events("unavailable").count == 1 && others.allSatisfy { !$0.lost(restarting).isEmpty }
        }
        #expect(noticed, "daemon stop not noticed: h1 \(restarting.events); others \(others.map(\.events))")

        let daemonStarted = monotonicNanoseconds()
        try lab.startAvahi(1)
        // Wait for all three signs: the others may see h1's new registration before h1's own
        // callback reports it, so the registered event is part of the condition, not checked after.
        let back = waitUntil(probes, timeout: Self.timeToFind) {
            !restarting.events("recovered").isEmpty && restarting.events("registered").count >= 2
                && others.allSatisfy { $0.found(restarting).count >= 2 }
        }
        #expect(back, "h1 not discoverable again: h1 \(restarting.events); others \(others.map(\.events))")
        for other in others {
            if let again = other.found(restarting).dropFirst().first {
                #expect(again.host == lab.address(ofHost: 1))
                #expect(again.port == 7001)
                print("discovery timing, ms (avahi restarted on h1 → h\(other.host) finds h1 again): "
                      + String(format: "%.0f", (Double(again.t) - Double(daemonStarted)) / 1e6))
            }
        }
        // h1's probe re-registered under its name and still knows h2 and h3: after the outage it
        // browses them again, and the same host and port are not reported a second time. Peers not
        // seen again within 5 s of recovery would be reported lost, so watch a little longer.
        #expect(restarting.events("registered").map(\.name) == ["peer-h1", "peer-h1"])
        observe(probes, for: .seconds(6))
        for other in others {
            #expect(restarting.found(other).count == 1)
            #expect(restarting.lost(other).isEmpty)
        }

        for probe in probes {
            #expect(probe.stop() == 0)
            probe.checkInvariants()
        }
    }
}
