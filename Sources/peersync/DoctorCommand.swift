import ArgumentParser
import Foundation
import NIOCore
import NIOPosix
import PeerSync
import PeerSyncDiscovery

struct Doctor: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Explain why sync does not work: store, device key and group, listen port, running node, and each --peer.")

    @OptionGroup var options: StoreOptions
    @Option(help: "The address `peersync run` listens on.") var listen: String = "0.0.0.0:7946"
    @Option(name: .customLong("peer"), help: "A peer to check, HOST:PORT (repeatable).") var peers: [String] = []
    @Flag(help: "Check peers without TLS (as `run --insecure`).") var insecure = false

    func run() async throws {
        var failures = 0
        func report(_ ok: Bool, _ text: String) {
            print("\(ok ? "ok  " : "FAIL")  \(text)")
            if !ok { failures += 1 }
        }
        let store = try? options.openStore()
        report(store != nil, store.map { "store \(options.directory): replica \($0.replicaID) (\($0.state.name))" }
            ?? "no replica at \(options.directory) (run `peersync init`)")
        let security: SessionSecurity = insecure ? .insecure : .tls
        var replica: Replica?
        if store != nil {
            do {
                replica = try options.openReplica()
                report(true, "device key \(replica!.deviceID) (\(replica!.role?.description ?? "not an active member")); group \(replica!.groupID)")
            } catch {
                report(false, "\(error)")
            }
        }
        let address = try parseHostPort(listen)
        if let node = runningNode(options) {
            report(true, "a node runs on this store (pid \(node.pid), listening on \(node.listen), \(node.peers.count) peers connected)")
        } else {
            do {
                let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                    .bind(host: address.host, port: Int(address.port)).get()
                try await channel.close()
                report(true, "port \(address.port) on \(address.host) is free for `peersync run` (no node running on this store)")
            } catch {
                report(false, "cannot listen on \(listen): \(error) (another program on that port? choose --listen)")
            }
        }
        do {
            // Browse for two seconds: is an avahi daemon reachable, and who is out there?
            let discovery = PeerDiscovery()
            let events = discovery.start(advertising: nil)
            let ownTag = replica?.groupID.discoveryTag ?? "?"
            let ownID = store?.replicaID
            var found: [DiscoveredPeer] = []
            var unavailable: String?
            let collector = Task {
                for await event in events {
                    switch event {
                    case .found(let peer): found.append(peer)
                    case .unavailable(let error): unavailable = "\(error)"
                    default: break
                    }
                }
                return (found, unavailable)
            }
            try? await Task.sleep(for: .seconds(2))
            discovery.stop()
            let (peersFound, problem) = await collector.value
            if let problem {
                report(false, "discovery: \(problem) — peers can still be given with --peer")
            } else {
                report(true, "discovery: avahi daemon reachable, \(peersFound.count) PeerSync node(s) visible")
                for peer in peersFound where peer.replicaID != ownID {
                    let verdict: String
                    if peer.groupTag != ownTag { verdict = "another sync group: never connected" }
                    else if peer.protocolVersion != 1 { verdict = "protocol version \(peer.protocolVersion.map(String.init) ?? "?"): cannot sync with this build" }
                    else { verdict = "same group: `peersync run` connects to it" }
                    print("      \(peer.serviceName) at \(peer.host):\(peer.port) — \(verdict)")
                }
            }
        }
        for text in peers {
            let peer = try parseHostPort(text)
            guard let groupID = replica?.groupID else {
                report(false, "peer \(text): not checked (no replica here)")
                continue
            }
            let result = await SessionProbe.probe(peer, security: security, groupID: groupID)
            if let hello = result.hello {
                let offset = Double(result.clockOffsetMilliseconds ?? 0) / 1000
                report(true, "peer \(text): \(hello.name) (\(hello.replicaID.shortDescription)), protocol \(hello.protocolVersion), clock offset \(String(format: "%+.1f", offset)) s")
            } else {
                report(false, "peer \(text): \(result.failure ?? "no answer")")
            }
        }
        if failures > 0 { throw ExitCode(1) }
    }
}
