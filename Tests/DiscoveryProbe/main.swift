// peersync-discovery-probe: runs PeerDiscovery and prints one JSON line per event on stdout.
//
//   peersync-discovery-probe --name N --port P --replica HEX --group TAG [--version V] [--no-advertise]
//                            [--service-type T]
//
// Lines (keys sorted; "t" is CLOCK_MONOTONIC in nanoseconds, comparable across processes):
//   {"event":"start","t":…}
//   {"event":"registered","name":"peer-h1","t":…}
//   {"event":"found","group":"…","host":"10.77.0.12","name":"peer-h2","port":7002,"replica":"…","t":…,"version":1}
//   {"event":"lost","name":"peer-h2","t":…}
//   {"event":"unavailable","code":-65537,"error":"kDNSServiceErr_Unknown (-65537): …","t":…}
//   {"event":"recovered","t":…}
//   {"event":"stopped","exited":true,"t":…}
// SIGTERM or SIGINT stops discovery with `stopAndWait()` (withdrawing the advertisement) and exits 0;
// "exited" says whether the discovery thread had finished when `stopAndWait()` returned.
//
// Two modes without discovery, for the limits lab (LimitsLabTests):
//   peersync-discovery-probe --hold PORT
//       a black hole: accepts every TCP connection on 0.0.0.0:PORT and never sends a byte
//       {"event":"holding","port":PORT,"t":…}
//   peersync-discovery-probe --flood HOST:PORT --connections N [--duration S]
//       opens N idle TCP connections to HOST:PORT one after the other, then every 250 ms reports
//       how many the peer has closed; closes them all and exits after S seconds (default 60)
//       {"event":"flood","failed":F,"opened":O,"t":…}
//       {"event":"flood-status","closed":C,"open":O,"t":…}
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Dispatch
import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncDiscovery

struct Line: Encodable {
    var event: String
    var t: UInt64 = monotonicNanoseconds()
    var name: String?
    var replica: String?
    var group: String?
    var version: Int?
    var host: String?
    var port: UInt16?
    var code: Int32?
    var error: String?
    var exited: Bool?
}

func monotonicNanoseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) * 1_000_000_000 + UInt64(now.tv_nsec)
}

func emit(_ line: Line) {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
    guard var data = try? encoder.encode(line) else { return }
    data.append(UInt8(ascii: "\n"))
    FileHandle.standardOutput.write(data)  // unbuffered: one write(2) per line
}

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("peersync-discovery-probe: \(message)\n".utf8))
    exit(2)
}

struct Options {
    var hold: UInt16?
    var flood: (host: String, port: UInt16)?
    var connections = 1_000
    var duration = 60.0
    var name: String?
    var port: UInt16 = 7000
    var replica = ReplicaID.random()
    var group = "test-group"
    var version = 1
    var advertise = true
    var serviceType = "_peersync._tcp"
}

func parseOptions(_ arguments: [String]) -> Options {
    var options = Options()
    var rest = arguments[...]
    func value(_ option: String) -> String {
        guard let value = rest.popFirst() else { fail("\(option) needs a value") }
        return value
    }
    while let argument = rest.popFirst() {
        switch argument {
        case "--name":
            options.name = value(argument)
        case "--port":
            guard let port = UInt16(value(argument)) else { fail("--port needs a number 0...65535") }
            options.port = port
        case "--replica":
            guard let replica = ReplicaID(hex: value(argument)) else { fail("--replica needs 32 hexadecimal digits") }
            options.replica = replica
        case "--group":
            options.group = value(argument)
        case "--version":
            guard let version = Int(value(argument)) else { fail("--version needs a number") }
            options.version = version
        case "--service-type":
            options.serviceType = value(argument)
        case "--no-advertise":
            options.advertise = false
        case "--hold":
            guard let port = UInt16(value(argument)) else { fail("--hold needs a port") }
            options.hold = port
        case "--flood":
            let target = value(argument)
            guard let colon = target.lastIndex(of: ":"), let port = UInt16(target[target.index(after: colon)...]) else {
                fail("--flood needs HOST:PORT")
            }
            options.flood = (String(target[..<colon]), port)
        case "--connections":
            guard let count = Int(value(argument)), count > 0 else { fail("--connections needs a positive number") }
            options.connections = count
        case "--duration":
            guard let seconds = Double(value(argument)), seconds > 0 else { fail("--duration needs seconds") }
            options.duration = seconds
        default:
            fail("unknown argument \(argument)")
        }
    }
    return options
}

let options = parseOptions(Array(CommandLine.arguments.dropFirst()))
if let port = options.hold { holdConnections(port: port) }
if let (host, port) = options.flood { flood(host: host, port: port, connections: options.connections, seconds: options.duration) }
let advertisement = options.advertise
    ? PeerAdvertisement(
        serviceName: options.name ?? "peersync-\(options.replica.shortDescription)", port: options.port,
        replicaID: options.replica, groupTag: options.group, protocolVersion: options.version)
    : nil
let discovery = PeerDiscovery(serviceType: options.serviceType)

/// SIGTERM/SIGINT are delivered into `signals`; the first one stops discovery, the event loop
/// below then ends and the process exits 0. (A plain function, so the handler is not main-actor
/// isolated: it runs on a dispatch queue.)
func installStopHandlers(_ signals: AsyncStream<Int32>.Continuation) -> [any DispatchSourceSignal] {
    [SIGTERM, SIGINT].map { signalNumber in
        signal(signalNumber, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: signalNumber, queue: .global())
        source.setEventHandler { signals.yield(signalNumber) }
        source.resume()
        return source
    }
}

let (signals, signalled) = AsyncStream.makeStream(of: Int32.self)
let signalSources = installStopHandlers(signalled)
let stopper = Task { () -> Bool? in
    for await _ in signals {
        return await discovery.stopAndWait()
    }
    return nil  // the events ended without a signal
}
emit(Line(event: "start"))
for await event in discovery.start(advertising: advertisement) {
    switch event {
    case .registered(let registered):
        emit(Line(event: "registered", name: registered))
    case .found(let peer):
        emit(Line(
            event: "found", name: peer.serviceName, replica: peer.replicaID?.description, group: peer.groupTag,
            version: peer.protocolVersion, host: peer.host, port: peer.port))
    case .lost(let serviceName):
        emit(Line(event: "lost", name: serviceName))
    case .unavailable(let error):
        emit(Line(event: "unavailable", code: error.code, error: error.description))
    case .recovered:
        emit(Line(event: "recovered"))
    }
}
signalled.finish()
emit(Line(event: "stopped", exited: await stopper.value))
withExtendedLifetime(signalSources) {}
exit(0)
