import Foundation
import PeerSync
import PeerSyncModel
@testable import PeerSyncReplication
@testable import PeerSyncNetwork
import PeerSyncTestSupport
@testable import PeerSyncWire
import Testing

/// PeerSync's attachment (Swift Testing has a type of that name too).
typealias FileRef = PeerSyncModel.Attachment

/// A record with one attachment.
private struct Document: SyncRecord, Hashable {
    static let collection = "documents"
    var id: UUID
    var file: FileRef
}

private let attachmentKinds = AttachmentWireLimits.kinds

/// The attachment half of the replication core, driven without sockets or files: the tests
/// answer the file work (`AttachmentIO`) themselves.
@Suite("Replication core: attachments")
struct AttachmentCoreTests {
    let t0 = ContinuousClock.now
    let file = FileRef(contentHash: AttachmentHash(bytes: [UInt8](repeating: 7, count: 32))!, byteCount: 100_000)

    /// `b` holds a document referencing ``file`` (and, as its check answers, the bytes); `a`
    /// gets the document, lacks the bytes, and is told so by its check.
    func setUp(bAnnounces: Bool) throws -> (CoreNode, CoreNode, CoreLink) {
        var a = CoreNode("a", attachments: true)
        var b = CoreNode("b", attachments: bAnnounces)
        try b.write { try $0.save(Document(id: UUID(), file: file)) }
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        #expect(a.state.digest == b.state.digest)
        // a looked the new reference up on its disk: nothing there.
        #expect(a.attachmentIO == [.check([file])])
        a.attachmentIO = []
        a.handle(a.core.attachmentsChecked([(file, .partial(bytes: 0))], maxBytes: 64 << 20, now: t0))
        try link.settle(&a, &b, now: t0)
        return (a, b, link)
    }

    @Test("hello announces the feature; a peer that did not announce it gets no attachment message")
    func onlyToPeersThatAnnounce() throws {
        let (_, b, link) = try setUp(bAnnounces: false)
        let helloFromA = try #require(link.framesToB.messages().compactMap { if case .hello(let h) = $0 { h } else { nil } }.first)
        #expect(helloFromA.features.contains(.attachments))
        let helloFromB = try #require(link.framesToA.messages().compactMap { if case .hello(let h) = $0 { h } else { nil } }.first)
        #expect(!helloFromB.features.contains(.attachments))
        #expect(!link.framesToB.contains { attachmentKinds.contains($0.type) })
        #expect(!link.aClosed && b.closedTransports.isEmpty && b.warnings.isEmpty)

        // The same exchange with a peer that announced it: a asks for the bytes.
        let (_, b2, link2) = try setUp(bAnnounces: true)
        let requests = link2.framesToB.filter { $0.type == AttachmentWireLimits.requestKind }
        #expect(requests.count == 1)
        let request = try decodeAttachmentRequest(requests[0].body)
        #expect(request.hash == file.contentHash.bytes && request.offset == 0 && request.length == 100_000)
        #expect(b2.attachmentIO.contains(.serve(link2.bSession, file.contentHash, offset: 0, length: 100_000)))
    }

    @Test("an attachment frame to a node without the feature is an unknown type: the session closes")
    func unknownTypeWithoutFeature() throws {
        var a = CoreNode("a", attachments: true)
        var b = CoreNode("b", attachments: false)
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        let body = encodeAttachmentUnavailable(hash: file.contentHash.bytes)
        b.handle(b.core.receive(link.bSession, type: AttachmentWireLimits.unavailableKind, body: body, now: t0,
                                wallClock: HybridLogicalClock.wallClock(), state: b.state))
        #expect(b.logs.contains { $0.message.contains("unknown message type") })
    }

    @Test("data outside what was asked for is refused and nothing is written; bytes that do not hash right are discarded")
    func refusesBadData() throws {
        var (a, b, link) = try setUp(bAnnounces: true)
        a.attachmentIO = []
        let hash = file.contentHash
        func deliver(_ data: AttachmentDataBody) {
            a.handle(a.core.receive(link.aSession, type: AttachmentWireLimits.dataKind, body: encodeAttachmentData(data), now: t0,
                                    wallClock: HybridLogicalClock.wallClock(), state: a.state))
        }
        // b serves the range; a writes it, verifies the file, and (it does not match) discards it.
        let bytes = [UInt8](repeating: 9, count: 100_000)
        b.handle(b.core.attachmentRead(link.bSession, hash, offset: 0, result: .success((bytes, 100_000))))
        try link.settle(&a, &b, now: t0)
        #expect(a.attachmentIO == [.write(hash, offset: 0, bytes: bytes), .verify(hash)])
        a.attachmentIO = []
        let requestsBefore = link.framesToB.count { $0.type == AttachmentWireLimits.requestKind }
        a.handle(a.core.attachmentVerified(hash, matches: false, now: t0))
        #expect(a.attachmentIO == [.discard(hash)])
        #expect(a.warnings.contains { $0.message.contains("do not match their hash") })
        // ... and asks again.
        try link.settle(&a, &b, now: t0)
        #expect(link.framesToB.count { $0.type == AttachmentWireLimits.requestKind } == requestsBefore + 1)
        a.attachmentIO = []

        // The answer claims more bytes than the attachment has (a larger total): refused, nothing written.
        deliver(AttachmentDataBody(hash: hash.bytes, offset: 0, total: 200_000, bytes: [UInt8](repeating: 1, count: 150_000)))
        #expect(a.attachmentIO.isEmpty)
        #expect(a.warnings.contains { $0.message.contains("attachment bytes refused") })
        #expect(a.closedTransports.isEmpty && !link.aClosed)

        // A range the decoder refuses outright (over 1 MiB in one message) closes the session.
        var c = CoreNode("c", attachments: true)
        var d = CoreNode("d", attachments: true)
        var link2 = CoreLink.connect(&c, &d, now: t0)
        try link2.settle(&c, &d, now: t0)
        let huge = AttachmentDataBody(hash: hash.bytes, offset: 0, total: 4 << 20, bytes: [UInt8](repeating: 0, count: (1 << 20) + 1))
        c.handle(c.core.receive(link2.aSession, type: AttachmentWireLimits.dataKind, body: encodeAttachmentData(huge), now: t0,
                                wallClock: HybridLogicalClock.wallClock(), state: c.state))
        #expect(c.warnings.contains { $0.message.contains("closing session") })
        #expect(!c.attachmentIO.contains { if case .write = $0 { true } else { false } })
    }

    @Test("a peer's data frames stay within the frame limit it announced")
    func servesWithinPeerFrameLimit() throws {
        var a = CoreNode("a", maxFrameBytes: 65_536, attachments: true)
        var b = CoreNode("b", attachments: true)
        var link = CoreLink.connect(&a, &b, now: t0)
        try link.settle(&a, &b, now: t0)
        let big = FileRef(contentHash: file.contentHash, byteCount: 1_000_000)
        a.handle(a.core.attachmentsChecked([(big, .partial(bytes: 300_000))], maxBytes: 64 << 20, now: t0))
        try link.settle(&a, &b, now: t0)
        // a resumes at the bytes it has, asking for no more than fits its own frames.
        let request = try decodeAttachmentRequest(try #require(link.framesToB.last { $0.type == AttachmentWireLimits.requestKind }).body)
        #expect(request.offset == 300_000)
        #expect(request.length <= UInt64(65_536 - AttachmentWireLimits.dataFrameOverhead))
        // Even if asked for more, b answers within a's limit.
        let serve = try #require(b.attachmentIO.last)
        guard case .serve(_, _, _, let length) = serve else { Issue.record("expected a read, got \(serve)"); return }
        #expect(length <= 65_536 - AttachmentWireLimits.dataFrameOverhead)
        b.handle(b.core.attachmentRead(link.bSession, file.contentHash, offset: 300_000,
                                       result: .success(([UInt8](repeating: 1, count: length), 1_000_000))))
        try link.settle(&a, &b, now: t0)
        let data = try #require(link.framesToA.last { $0.type == AttachmentWireLimits.dataKind })
        #expect(data.size <= 65_536)
        #expect(a.attachmentIO.contains(.write(file.contentHash, offset: 300_000, bytes: [UInt8](repeating: 1, count: length))))
    }
}
