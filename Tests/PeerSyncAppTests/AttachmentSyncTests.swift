import Foundation
import Logging
@testable import PeerSync
import PeerSyncTestSupport
import Testing

/// Starts sync on both over 127.0.0.1 with TLS (`b` dials `a`), each configuration adjusted by
/// the caller, and waits until they are connected. Returns `a`'s port.
@discardableResult
private func connect(_ a: Replica, _ b: Replica, adjustA: (inout SyncConfiguration) -> Void = { _ in },
                     adjustB: (inout SyncConfiguration) -> Void = { _ in }) async throws -> UInt16 {
    var configA = SyncConfiguration(security: .tls, listen: .loopback(0))
    adjustA(&configA)
    let port = try await a.startSync(configA)
    try await dial(b, port: port, adjust: adjustB)
    return port
}

/// Starts sync on `b` dialing `port` and waits until it is connected.
private func dial(_ b: Replica, port: UInt16, adjust: (inout SyncConfiguration) -> Void = { _ in }) async throws {
    var config = SyncConfiguration(security: .tls, listen: nil, peers: [.loopback(port)])
    adjust(&config)
    try await b.startSync(config)
    let connected = await eventually(timeout: .seconds(60)) { !(await b.peers().isEmpty) }
    try #require(connected, "the replicas did not connect")
}

/// Waits until `replica` holds `book`.
private func waitForBook(_ replica: Replica, _ book: Book) async throws {
    let arrived = await eventually(timeout: .seconds(60)) { (try? replica.fetch(Book.self, id: book.id)) != nil }
    try #require(arrived, "the record did not arrive")
}

/// Waits until the complete bytes of `attachment` are stored at `replica`.
private func waitForBytes(_ replica: Replica, _ attachment: Attachment) async -> Bool {
    await eventually(timeout: .seconds(120), every: .milliseconds(20)) { replica.attachmentURL(for: attachment) != nil }
}

private func partialPath(_ app: TestApp, _ attachment: Attachment) -> String {
    app.directory + "/attachments/" + attachment.contentHash.hex + ".partial"
}

@Suite("Attachments: transfer between peers over TLS on 127.0.0.1", .serialized, .timeLimit(.minutes(5)))
struct AttachmentSyncTests {
    @Test("a peer fetches a referenced attachment it lacks and ends with identical bytes")
    func transfersAttachment() async throws {
        let a = try TestApp("att-a")
        let b = try TestApp("att-b")
        defer { Task { await a.close(); await b.close() } }
        let bytes = randomData(3_000_000, seed: 11)
        let cover = try await a.replica.addAttachment(bytes, mediaType: "image/jpeg")
        let book = Book(id: UUID(), title: "Dune", cover: cover)
        try await a.replica.save(book)
        #expect(b.replica.attachmentAvailability(for: cover) == .notYetAvailable)

        try await connect(a.replica, b.replica)
        try await waitForBook(b.replica, book)
        #expect(await waitForBytes(b.replica, cover), "the attachment's bytes did not arrive")
        #expect(try await b.replica.attachmentData(for: cover) == bytes)
        #expect(!FileManager.default.fileExists(atPath: partialPath(b, cover)))
        // Each byte crossed once.
        #expect(await b.replica.traffic().attachmentBytesReceived == bytes.count)
        #expect(await a.replica.traffic().attachmentBytesSent == bytes.count)
    }

    @Test("a transfer interrupted earlier resumes from the bytes already stored, sending none of them again")
    func resumesFromStoredPartial() async throws {
        let a = try TestApp("att-a")
        let b = try TestApp("att-b")
        defer { Task { await a.close(); await b.close() } }
        let bytes = randomData(2_500_000, seed: 12)
        let note = try await a.replica.addAttachment(bytes, mediaType: "audio/mp4")
        let book = Book(id: UUID(), title: "Voice", cover: nil, voiceNotes: [note])
        try await a.replica.save(book)
        // What an earlier session stored before it broke: the first 1,000,000 bytes.
        let stored = 1_000_000
        try b.replica.attachmentStore.writePartial(note.contentHash, offset: 0, bytes: bytes.prefix(stored))
        #expect(b.replica.attachmentAvailability(for: note) == .downloading(receivedBytes: Int64(stored), totalBytes: note.byteCount))

        try await connect(a.replica, b.replica)
        #expect(await waitForBytes(b.replica, note), "the attachment's bytes did not arrive")
        #expect(try await b.replica.attachmentData(for: note) == bytes)
        #expect(await b.replica.traffic().attachmentBytesReceived == bytes.count - stored)
        #expect(await a.replica.traffic().attachmentBytesSent == bytes.count - stored)
    }

    @Test("a session closed mid-transfer resumes on the next one without re-sending what was stored")
    func resumesAfterSessionClosed() async throws {
        let a = try TestApp("att-a")
        let b = try TestApp("att-b")
        defer { Task { await a.close(); await b.close() } }
        let bytes = randomData(4_000_000, seed: 13)
        let cover = try await a.replica.addAttachment(bytes)
        let book = Book(id: UUID(), title: "Big", cover: cover)
        try await a.replica.save(book)
        // Small ranges, so the transfer takes many round trips.
        let port = try await connect(a.replica, b.replica) { _ in } adjustB: { $0.limits.attachmentRangeBytes = 64 << 10 }
        let started = await eventually(timeout: .seconds(60), every: .milliseconds(1)) {
            if case .downloading(let received, _) = b.replica.attachmentAvailability(for: cover), received >= 64 << 10 { return true }
            return b.replica.attachmentURL(for: cover) != nil
        }
        try #require(started, "the transfer did not start")
        await b.replica.stopSync()
        // Everything written so far stays; the partial file only grows until the queue is idle.
        let storedBeforeRestart: Int64 = switch b.replica.attachmentAvailability(for: cover) {
        case .downloading(let received, _): received
        case .available: Int64(bytes.count)
        case .notYetAvailable: 0
        }
        #expect(storedBeforeRestart >= 64 << 10)

        try await dial(b.replica, port: port) { $0.limits.attachmentRangeBytes = 64 << 10 }
        #expect(await waitForBytes(b.replica, cover), "the attachment's bytes did not arrive")
        #expect(try await b.replica.attachmentData(for: cover) == bytes)
        // The second session carried at most what was missing at the restart.
        let second = await b.replica.traffic().attachmentBytesReceived
        #expect(Int64(second) <= Int64(bytes.count) - storedBeforeRestart)
    }

    @Test("bytes that do not match their hash are refused and nothing is stored")
    func corruptedBytesRefused() async throws {
        let lines = RecordingLogHandler.Lines()
        let a = try TestApp("att-a")
        let b = try TestApp("att-b", logger: RecordingLogHandler.logger("att-b", into: lines, level: .debug))
        defer { Task { await a.close(); await b.close() } }
        let bytes = randomData(600_000, seed: 14)
        let cover = try await a.replica.addAttachment(bytes)
        try await a.replica.save(Book(id: UUID(), title: "Rotten", cover: cover))
        // The sender's copy rots on disk: one byte flipped, same length.
        let file = try #require(a.replica.attachmentURL(for: cover))
        let handle = try FileHandle(forUpdating: file)
        try handle.seek(toOffset: 300_000)
        try handle.write(contentsOf: Data([bytes[300_000] ^ 0xFF]))
        try handle.close()

        try await connect(a.replica, b.replica)
        // The peer is asked again once, then no more (two failures per peer).
        let refused = await eventually(timeout: .seconds(60)) {
            lines.all.count { $0.contains("do not match their hash") } >= 2
        }
        #expect(refused, "the corrupted bytes were not refused twice")
        let discarded = await eventually(timeout: .seconds(30)) { !FileManager.default.fileExists(atPath: partialPath(b, cover)) }
        #expect(discarded, "the refused bytes were left in a partial file")
        #expect(b.replica.attachmentURL(for: cover) == nil)
        #expect(!FileManager.default.fileExists(atPath: b.directory + "/attachments/" + cover.contentHash.hex))
        #expect(!(await b.replica.peers().isEmpty), "refusing bytes must not end the session")
    }

    @Test("an attachment over the size setting is not fetched, with a line that says how to allow it")
    func oversizeNotFetched() async throws {
        let lines = RecordingLogHandler.Lines()
        let a = try TestApp("att-a")
        let b = try TestApp("att-b", logger: RecordingLogHandler.logger("att-b", into: lines, level: .debug))
        defer { Task { await a.close(); await b.close() } }
        try await b.replica.setSetting(SettingKey.attachmentMaxBytes, to: .int(100_000), scope: .synced)
        let bytes = randomData(300_000, seed: 15)
        let cover = try await a.replica.addAttachment(bytes)
        let book = Book(id: UUID(), title: "Huge", cover: cover)
        try await a.replica.save(book)

        try await connect(a.replica, b.replica)
        try await waitForBook(b.replica, book)
        let said = await eventually(timeout: .seconds(60)) {
            lines.all.contains { $0.contains("over the size bound") && $0.contains("attachmentMaxBytes") }
        }
        #expect(said, "no line about the size bound")
        #expect(b.replica.attachmentAvailability(for: cover) == .notYetAvailable)
        #expect(await b.replica.traffic().attachmentBytesReceived == 0)
        #expect(await a.replica.traffic().attachmentBytesSent == 0)
    }

    @Test("a peer that does not announce the feature never gets an attachment message")
    func noCapabilityNoMessages() async throws {
        let lines = RecordingLogHandler.Lines()
        let a = try TestApp("att-a")
        let b = try TestApp("att-b", logger: RecordingLogHandler.logger("att-b", into: lines, level: .debug))
        defer { Task { await a.close(); await b.close() } }
        // b (an older node, as far as attachments go) holds the bytes; a lacks them.
        let bytes = randomData(200_000, seed: 16)
        let cover = try await b.replica.addAttachment(bytes)
        let book = Book(id: UUID(), title: "Old peer", cover: cover)
        try await b.replica.save(book)

        try await connect(a.replica, b.replica) { _ in } adjustB: { $0.attachments = false }
        try await waitForBook(a.replica, book)
        // Let several keepalives cross after the record arrived: a request would have been sent
        // right after the commit, and b would have closed the session on its unknown type.
        let before = await a.replica.traffic().framesReceived
        let quietTraffic = await eventually(timeout: .seconds(60)) { await a.replica.traffic().framesReceived >= before + 4 }
        try #require(quietTraffic)
        #expect(!lines.all.contains { $0.contains("unknown message") || $0.contains("closing session") })
        let peersOfA = await a.replica.peers()
        let peersOfB = await b.replica.peers()
        #expect(!peersOfA.isEmpty && !peersOfB.isEmpty)
        #expect(a.replica.attachmentAvailability(for: cover) == .notYetAvailable)
        #expect(await b.replica.traffic().attachmentBytesSent == 0)
    }
}
