import Crypto
import Foundation
import Logging
@testable import PeerSync
import PeerSyncStore
import PeerSyncTestSupport
import Testing

/// A record with attachments: a single one, and a list.
struct Book: SyncRecord, Hashable {
    static let collection = "books"
    var id: UUID
    var title: String
    var cover: Attachment?
    var voiceNotes: [Attachment] = []
}

func sha256(_ data: Data) -> AttachmentHash { AttachmentHash(bytes: Array(SHA256.hash(data: data)))! }

func randomData(_ count: Int, seed: UInt64) -> Data {
    var rng = SeededGenerator(seed: seed)
    return Data((0..<count).map { _ in UInt8.random(in: 0...255, using: &rng) })
}

@Suite("Attachments: the store", .ownThread, .timeLimit(.minutes(6)))
struct AttachmentStoreTests {
    @Test("an attachment encodes as a map of sha256, size and type, and is found in nested values")
    func encoding() throws {
        let attachment = Attachment(contentHash: sha256(Data("cover".utf8)), byteCount: 5, mediaType: "image/jpeg")
        let book = Book(id: UUID(), title: "Dune", cover: attachment, voiceNotes: [attachment])
        let fields = try FieldEncoder().encodeFields(book)
        #expect(fields["cover"] == .map(["sha256": .bytes(attachment.contentHash.bytes), "size": .int(5), "type": "image/jpeg"]))
        #expect(fields["cover"] == attachment.fieldValue)
        #expect(Attachment(fieldValue: attachment.fieldValue) == attachment)
        #expect(Attachment.referenced(in: fields) == [attachment])
        #expect(try FieldDecoder().decode(Book.self, fromFields: fields) == book)
        // Not attachments: a short hash, a negative size, an extra key.
        #expect(Attachment(fieldValue: .map(["sha256": .bytes([1, 2]), "size": 1, "type": "x"])) == nil)
        #expect(Attachment(fieldValue: .map(["sha256": .bytes(attachment.contentHash.bytes), "size": -1, "type": "x"])) == nil)
        #expect(Attachment(fieldValue: .map(["sha256": .bytes(attachment.contentHash.bytes), "size": 1, "type": "x", "more": 1])) == nil)
        #expect(AttachmentHash(hex: attachment.contentHash.hex) == attachment.contentHash)
    }

    @Test("adding stores the bytes under their hash, once, atomically")
    func addDeduplicatesAtomically() async throws {
        let app = try TestApp("attach")
        defer { Task { await app.close() } }
        let bytes = randomData(300_000, seed: 1)
        let first = try await app.replica.addAttachment(bytes, mediaType: "image/png")
        #expect(first.contentHash == sha256(bytes))
        #expect(first.byteCount == 300_000 && first.mediaType == "image/png")
        let path = app.directory + "/attachments/" + first.contentHash.hex
        #expect(FileManager.default.contents(atPath: path) == bytes)
        #expect(app.replica.attachmentURL(for: first)?.path == path)
        #expect(app.replica.attachmentAvailability(for: first) == .available(URL(fileURLWithPath: path)))
        #expect(try await app.replica.attachmentData(for: first) == bytes)

        // The same bytes again (as data, and from a file): the same attachment, one file.
        let file = app.directory + "/cover.jpg"
        try bytes.write(to: URL(fileURLWithPath: file))
        let again = try await app.replica.addAttachment(bytes, mediaType: "image/png")
        let fromFile = try await app.replica.addAttachment(contentsOf: URL(fileURLWithPath: file))
        #expect(again == first)
        #expect(fromFile.contentHash == first.contentHash && fromFile.mediaType == "image/jpeg")
        let names = try FileManager.default.contentsOfDirectory(atPath: app.directory + "/attachments")
        #expect(names == [first.contentHash.hex])  // no temporary or partial file left behind

        // Bytes that never arrived read nil.
        let missing = Attachment(contentHash: sha256(Data("elsewhere".utf8)), byteCount: 9)
        #expect(try await app.replica.attachmentData(for: missing) == nil)
        #expect(app.replica.attachmentURL(for: missing) == nil)
        #expect(app.replica.attachmentAvailability(for: missing) == .notYetAvailable)
    }

    @Test("over the size bound: a clear error and nothing stored; the bound is a synced setting")
    func sizeBound() async throws {
        let app = try TestApp("bound")
        defer { Task { await app.close() } }
        #expect(app.replica.attachmentMaxBytes == 64 << 20)
        try await app.replica.setSetting(SettingKey.attachmentMaxBytes, to: 1_000, scope: .synced)
        #expect(app.replica.attachmentMaxBytes == 1_000)
        let big = randomData(1_001, seed: 2)
        let tooLarge = ReplicaError.attachment(AttachmentError.tooLarge(bytes: 1_001, limit: 1_000).description)
        await #expect(throws: tooLarge) {
            try await app.replica.addAttachment(big)
        }
        let file = app.directory + "/big.bin"
        try big.write(to: URL(fileURLWithPath: file))
        do {
            _ = try await app.replica.addAttachment(contentsOf: URL(fileURLWithPath: file))
            Issue.record("a file over the bound was stored")
        } catch {
            #expect(error == tooLarge)
            #expect(error.description.contains("over the limit of 1000 bytes"))
            #expect(error.description.contains("attachmentMaxBytes"))
        }
        let names = (try? FileManager.default.contentsOfDirectory(atPath: app.directory + "/attachments")) ?? []
        #expect(names.isEmpty)
        #expect(try await app.replica.addAttachment(randomData(1_000, seed: 3)).byteCount == 1_000)
    }

    @Test("purge deletes what no live record references and keeps what one does")
    func purge() async throws {
        let app = try TestApp("purge")
        defer { Task { await app.close() } }
        let replica = app.replica
        let cover = try await replica.addAttachment(randomData(10_000, seed: 4), mediaType: "image/jpeg")
        let note = try await replica.addAttachment(randomData(5_000, seed: 5), mediaType: "audio/mp4")
        let orphan = try await replica.addAttachment(randomData(1_000, seed: 6))
        let book = Book(id: UUID(), title: "Dune", cover: cover, voiceNotes: [note])
        try await replica.save(book)

        // Within the grace period nothing goes, not even the orphan.
        #expect(try await replica.purgeAttachments().isEmpty)
        // Without one, only the orphan goes.
        #expect(try await replica.purgeAttachments(keepingNewerThan: .zero) == [orphan.contentHash])
        #expect(replica.attachmentURL(for: orphan) == nil)
        #expect(replica.attachmentURL(for: cover) != nil && replica.attachmentURL(for: note) != nil)
        #expect(replica.missingAttachments().isEmpty)

        // After a commit removes the last reference, the bytes go without being asked
        // (grace period 0 here; 10 minutes by default).
        replica.setAttachmentPurgeGracePeriod(.zero)
        var edited = book
        edited.voiceNotes = []
        try await replica.save(edited)
        #expect(await eventually { replica.attachmentURL(for: note) == nil })
        #expect(replica.attachmentURL(for: cover) != nil)
        try await replica.delete(Book.self, id: book.id)
        #expect(await eventually { replica.attachmentURL(for: cover) == nil })

        // A record referencing bytes that are not here: listed as missing, never purged away.
        let remote = Attachment(contentHash: sha256(Data("remote".utf8)), byteCount: 6)
        try await replica.save(Book(id: UUID(), title: "From a peer", cover: remote))
        #expect(await eventually { replica.missingAttachments() == [remote] })
        try replica.attachmentStore.writePartial(remote.contentHash, offset: 0, bytes: Array("rem".utf8))
        #expect(replica.attachmentAvailability(for: remote) == .downloading(receivedBytes: 3, totalBytes: 6))
        #expect(try await replica.purgeAttachments(keepingNewerThan: .zero).isEmpty)
        #expect(replica.attachmentStore.partialSize(of: remote.contentHash) == 3)
    }

    @Test("bytes referenced and dropped again between two looks of the collector still go")
    func referencedAndDroppedBetweenLooks() async throws {
        let directory = try makeTemporaryDirectory("peersync-attach-between")
        defer { removeTemporaryDirectory(directory) }
        let store = try ReplicaStore.create(directory: directory, name: "between")
        let collector = AttachmentCollector(store: store, logger: Logger(label: "test.between"))
        defer { collector.stop() }
        collector.gracePeriod = .zero
        let note = try collector.files.add(randomData(2_000, seed: 7), mediaType: "audio/mp4", maxBytes: 1 << 20)
        collector.added(note.contentHash)
        // Referenced by one commit, dropped by the next, before the collector looks: it first
        // sees the state after both (as when two commits are drained together).
        let book = Book(id: UUID(), title: "Dune", voiceNotes: [note])
        try store.write { try $0.save(book) }
        var edited = book
        edited.voiceNotes = []
        try store.write { try $0.save(edited) }
        collector.start()
        #expect(collector.files.contains(note.contentHash))
        try store.write { try $0.save(Book(id: UUID(), title: "Another")) }
        // The count goes up just after the file goes: wait for the count, then look at the file.
        #expect(await eventually { collector.purgedAfterCommits == 1 }, "bytes no live record references stayed after a commit")
        #expect(!collector.files.contains(note.contentHash))
    }

    @Test("SIGKILL while adding: every file under a hash name holds exactly those bytes", arguments: 0..<4)
    func killNineWhileAdding(trial: Int) async throws {
        let directory = try makeTemporaryDirectory("peersync-attach-kill")
        defer { removeTemporaryDirectory(directory) }
        _ = try ReplicaStore.create(directory: directory, name: "victim")
        var rng = SeededGenerator(seed: baseSeed &+ 2_000 &+ UInt64(trial))
        let killAfter = Int.random(in: 1...4, using: &rng)
        let extra = Int.random(in: 0...60, using: &rng)
        let child = try ChildProcess(buildProductsDirectory().appendingPathComponent("peersync-app-child").path, ["attach", directory])
        var reported: [String] = []
        let deadline = ContinuousClock.now + .seconds(120)
        while reported.count < killAfter, let line = child.readLine(until: deadline) {
            if line.hasPrefix("added ") { reported.append(String(line.dropFirst(6))) }
        }
        let killAt = ContinuousClock.now + .milliseconds(extra)
        while ContinuousClock.now < killAt {
            if let line = child.readLine(until: killAt), line.hasPrefix("added ") { reported.append(String(line.dropFirst(6))) }
        }
        child.kill(SIGKILL)
        while let line = child.readLine(until: .now + .seconds(5)) {
            if line.hasPrefix("added ") { reported.append(String(line.dropFirst(6))) }
        }
        #expect(reported.count >= killAfter)
        let files = AttachmentStore(storeDirectory: directory)
        let stored = files.storedHashes()
        // Every reported attachment is there, and nothing under a hash name is torn.
        #expect(Set(reported).isSubset(of: Set(stored.map(\.hex))))
        for hash in stored {
            let data = try #require(try files.data(for: hash))
            #expect(sha256(data) == hash, "torn file \(hash.hex)")
        }
    }

    @Test("a crash between writing and renaming leaves no file under the final name")
    func noTornFiles() async throws {
        let app = try TestApp("torn")
        defer { Task { await app.close() } }
        let files = app.replica.attachmentStore
        // What an add interrupted before its rename leaves: a temporary file only.
        try FileManager.default.createDirectory(atPath: files.directory, withIntermediateDirectories: true)
        let leftover = files.directory + "/.tmp-crashed"
        try Data("half".utf8).write(to: URL(fileURLWithPath: leftover))
        #expect(files.storedHashes().isEmpty)
        #expect(try await app.replica.purgeAttachments(keepingNewerThan: .zero).isEmpty)
        #expect(!FileManager.default.fileExists(atPath: leftover))
    }
}
