// The probe's modes without discovery: a black-hole listener and a flood of idle connections.
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import Foundation

struct CountLine: Encodable {
    var event: String
    var t: UInt64 = monotonicNanoseconds()
    var port: UInt16?
    var opened: Int?
    var failed: Int?
    var closed: Int?
    var open: Int?
}

func emitCounts(_ line: CountLine) {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys]
    guard var data = try? encoder.encode(line) else { return }
    data.append(UInt8(ascii: "\n"))
    FileHandle.standardOutput.write(data)
}

/// As many descriptors as the hard limit allows (a flood holds one per connection).
func raiseDescriptorLimit() {
    var limit = rlimit()
    #if canImport(Glibc)
    let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
    #else
    let resource = RLIMIT_NOFILE
    #endif
    guard getrlimit(resource, &limit) == 0 else { return }
    limit.rlim_cur = limit.rlim_max
    _ = setrlimit(resource, &limit)
}

func ipv4(_ host: String, _ port: UInt16) -> sockaddr_in {
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = port.bigEndian
    guard inet_pton(AF_INET, host, &address.sin_addr) == 1 else { fail("not an IPv4 address: \(host)") }
    return address
}

func streamSocket() -> Int32 {
    #if canImport(Glibc)
    socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    #else
    socket(AF_INET, SOCK_STREAM, 0)
    #endif
}

/// Accepts every connection on 0.0.0.0:`port` and holds it, silent, until killed.
func holdConnections(port: UInt16) -> Never {
    raiseDescriptorLimit()
    let listener = streamSocket()
    var yes: Int32 = 1
    _ = setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &yes, socklen_t(MemoryLayout<Int32>.size))
    var address = ipv4("0.0.0.0", port)
    let bound = withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard bound == 0, listen(listener, 1024) == 0 else { fail("cannot listen on port \(port): errno \(errno)") }
    emitCounts(CountLine(event: "holding", port: port))
    var held: [Int32] = []
    while true {
        let connection = accept(listener, nil, nil)
        if connection >= 0 { held.append(connection) }
    }
}

/// Opens `connections` idle connections to `host`:`port`, reports every 250 ms how many the
/// peer closed, and exits after `seconds`.
func flood(host: String, port: UInt16, connections: Int, seconds: Double) -> Never {
    raiseDescriptorLimit()
    var address = ipv4(host, port)
    var descriptors: [Int32] = []
    var failed = 0
    for _ in 0..<connections {
        let descriptor = streamSocket()
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        if descriptor >= 0, connected == 0 {
            descriptors.append(descriptor)
        } else {
            failed += 1
            if descriptor >= 0 { close(descriptor) }
        }
    }
    emitCounts(CountLine(event: "flood", opened: descriptors.count, failed: failed))
    var open = descriptors.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
    var closed = 0
    let end = monotonicNanoseconds() + UInt64(seconds * 1e9)
    var nextReport = monotonicNanoseconds()
    while monotonicNanoseconds() < end {
        if !open.isEmpty, poll(&open, nfds_t(open.count), 50) > 0 {
            var buffer = [UInt8](repeating: 0, count: 4096)
            open.removeAll { entry in
                guard entry.revents != 0 else { return false }
                // Whatever the peer sends is read and dropped; end of stream or an error is a close.
                let received = recv(entry.fd, &buffer, buffer.count, Int32(MSG_DONTWAIT))
                guard received == 0 || (received < 0 && errno != EAGAIN && errno != EWOULDBLOCK) else { return false }
                close(entry.fd)
                closed += 1
                return true
            }
        } else if open.isEmpty {
            usleep(50_000)
        }
        if monotonicNanoseconds() >= nextReport {
            emitCounts(CountLine(event: "flood-status", closed: closed, open: open.count))
            nextReport += 250_000_000
        }
    }
    for entry in open { close(entry.fd) }
    exit(0)
}
