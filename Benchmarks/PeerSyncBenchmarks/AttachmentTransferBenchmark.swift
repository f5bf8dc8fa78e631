import Foundation
import Logging
import PeerSync

#if canImport(Glibc)
import Glibc
#endif

/// A record referencing one attachment, for the transfer benchmark.
private struct Cover: SyncRecord {
    static let collection = "bench_covers"
    var id: UUID
    var file: Attachment
}

/// Attachment transfer between two replicas over TLS on 127.0.0.1.
enum AttachmentTransferBenchmark {
    /// A 10 MB attachment: `addAttachment` + `save` on A → the bytes verified and stored on B
    /// (record sync, range requests, SHA-256 check, fsync + rename), and bytes on the sockets
    /// (TLS records included, both directions) against the attachment's size. The loopback
    /// limit for comparison: the same bytes over a plain TCP socket pair on 127.0.0.1.
    static let transfer = Benchmark(name: "attachment-transfer") { quick in
        let size = quick ? 1 << 20 : 10_000_000
        let rounds = quick ? 1 : 5
        let group = try LocalGroup.make(names: ["bench-a", "bench-b"])
        var logger = Logger(label: "bench.attach")
        logger.logLevel = .error
        let dirA = temporaryStoreDirectory()
        let dirB = temporaryStoreDirectory()
        defer {
            try? FileManager.default.removeItem(atPath: dirA)
            try? FileManager.default.removeItem(atPath: dirB)
        }
        let a = try Replica.create(at: dirA, member: 0, of: group, logger: logger)
        let b = try Replica.create(at: dirB, member: 1, of: group, logger: logger)
        let port = try await a.startSync(SyncConfiguration(security: .tls, listen: .loopback(0)))
        try await b.startSync(SyncConfiguration(security: .tls, listen: nil, peers: [.loopback(port)]))
        guard await waitUntil(seconds: 60, { !(await b.peers().isEmpty) }) else { throw BenchmarkError("replicas did not connect") }

        var rng = BenchRNG(state: 21)
        var bytes = Data((0..<size).map { _ in UInt8.random(in: 0...255, using: &rng) })
        var total: [Double] = []
        var afterRecord: [Double] = []
        var wireRatio: [Double] = []
        var wireBytes: [Double] = []
        for round in 0..<rounds {
            bytes[0] = UInt8(round)  // new content each round
            let beforeA = await a.traffic()
            let beforeB = await b.traffic()
            let start = ContinuousClock.now
            let attachment = try await a.addAttachment(bytes)
            let cover = Cover(id: UUID(), file: attachment)
            try await a.save(cover)
            var recordAt: ContinuousClock.Instant?
            let done = await waitUntil(seconds: 300) {
                if recordAt == nil, (try? b.fetch(Cover.self, id: cover.id)) != nil { recordAt = ContinuousClock.now }
                return b.attachmentURL(for: attachment) != nil
            }
            let end = ContinuousClock.now
            guard done else { throw BenchmarkError("the attachment did not arrive") }
            total.append(milliseconds(end - start))
            afterRecord.append(milliseconds(end - (recordAt ?? end)))
            let afterA = await a.traffic()
            let afterB = await b.traffic()
            let onWire = (afterA.bytesSent - beforeA.bytesSent) + (afterB.bytesSent - beforeB.bytesSent)
            wireBytes.append(Double(onWire))
            wireRatio.append(Double(onWire) / Double(size))
            guard try await b.attachmentData(for: attachment) == bytes else { throw BenchmarkError("the bytes differ") }
        }
        await b.stopSync()
        await a.stopSync()
        let loopback = (0..<rounds).map { _ in loopbackCopyMilliseconds(bytes: size) }

        func median(_ samples: [Double]) -> Double { samples.sorted()[samples.count / 2] }
        func megabytesPerSecond(_ ms: Double) -> Double { Double(size) / 1e6 / (ms / 1_000) }
        return Result(
            name: "attachment-transfer",
            detail: "\(size) random bytes, A adds+saves, B fetches over TLS on 127.0.0.1 (1 MiB ranges), median of \(rounds); "
                + "wire = socket bytes both ways incl. TLS; loopback = same bytes over a plain TCP socket pair",
            metrics: [
                "total_ms": median(total), "total_MBps": megabytesPerSecond(median(total)),
                "after_record_ms": median(afterRecord), "after_record_MBps": megabytesPerSecond(median(afterRecord)),
                "wire_bytes": median(wireBytes), "wire_per_payload_byte": median(wireRatio),
                "loopback_tcp_ms": median(loopback), "loopback_tcp_MBps": megabytesPerSecond(median(loopback)),
            ])
    }

    /// Polls `condition` every millisecond for at most `seconds`.
    private static func waitUntil(seconds: Int, _ condition: () async -> Bool) async -> Bool {
        let deadline = ContinuousClock.now + .seconds(seconds)
        while ContinuousClock.now < deadline {
            if await condition() { return true }
            try? await Task.sleep(for: .milliseconds(1))
        }
        return await condition()
    }

    /// Milliseconds to send `bytes` bytes through a plain TCP connection on 127.0.0.1 (one
    /// thread writes 1 MiB at a time, this one reads); -1 if a socket call fails.
    private static func loopbackCopyMilliseconds(bytes: Int) -> Double {
        #if canImport(Glibc)
        let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard listener >= 0 else { return -1 }
        defer { close(listener) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listener, $0, length) == 0 && listen(listener, 1) == 0
                && getsockname(listener, $0, &length) == 0 }
        }
        guard bound else { return -1 }
        let client = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard client >= 0 else { return -1 }
        let connected = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(client, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
        let server = accept(listener, nil, nil)
        guard connected, server >= 0 else {
            close(client)
            return -1
        }
        defer { close(server) }
        let start = ContinuousClock.now
        let writer = Thread {
            let chunk = [UInt8](repeating: 0x5A, count: 1 << 20)
            var left = bytes
            while left > 0 {
                let n = chunk.withUnsafeBytes { write(client, $0.baseAddress, min(left, chunk.count)) }
                if n <= 0 { break }
                left -= n
            }
            close(client)
        }
        writer.start()
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        var received = 0
        while received < bytes {
            let n = buffer.withUnsafeMutableBytes { read(server, $0.baseAddress, $0.count) }
            if n <= 0 { break }
            received += n
        }
        return received == bytes ? milliseconds(ContinuousClock.now - start) : -1
        #else
        return -1
        #endif
    }
}

struct BenchmarkError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
