import Foundation
@testable import PeerSync
import PeerSyncTestSupport
import PeerSyncWire
import Testing

/// The pure transfer state machine, driven against a real attachment directory and fake peers
/// that serve ranges from byte arrays (no sockets: the session shell is the lead's).
@Suite("Attachments: the transfer state machine", .timeLimit(.minutes(6)))
struct AttachmentTransferTests {
    let p1 = ReplicaID(high: 1, low: 1)
    let p2 = ReplicaID(high: 2, low: 2)

    /// Carries out actions as a session shell would: writes into `files`, verifies with
    /// SHA-256, and answers requests from `peers` (what each holds) while they are "online".
    struct Shell {
        var machine: AttachmentTransfer
        let files: AttachmentStore
        var peers: [ReplicaID: [AttachmentHash: [UInt8]]] = [:]
        var online: Set<ReplicaID> = []
        var requests: [AttachmentTransfer.Action] = []
        var log: [AttachmentTransfer.Action] = []
        /// Answer at most this many more requests, then go quiet (an interrupted connection).
        var answerBudget = Int.max

        mutating func send(_ event: AttachmentTransfer.Event) throws {
            try run(machine.handle(event))
        }

        mutating func run(_ actions: [AttachmentTransfer.Action]) throws {
            for action in actions {
                log.append(action)
                switch action {
                case .request:
                    requests.append(action)
                case .writePartial(let hash, let offset, let bytes):
                    try files.writePartial(hash, offset: offset, bytes: bytes)
                case .verifyPartial(let hash):
                    try send(.verified(hash, matches: try files.verifyPartial(hash)))
                case .promotePartial(let hash):
                    try files.promotePartial(hash)
                case .discardPartial(let hash):
                    files.discardPartial(hash)
                }
            }
        }

        /// Answers queued requests (in order) until none is left or the budget runs out.
        /// Bytes go through the real message encoding.
        mutating func pump(limit: Int = 10_000) throws {
            var steps = 0
            while !requests.isEmpty, answerBudget > 0, steps < limit {
                steps += 1
                guard case .request(let peer, let hash, let offset, let length) = requests.removeFirst(), online.contains(peer) else { continue }
                answerBudget -= 1
                guard let bytes = peers[peer]?[hash] else {
                    let body = encodeAttachmentUnavailable(hash: hash.bytes)
                    try send(.peerLacks(peer, AttachmentHash(bytes: try decodeAttachmentUnavailable(body))!))
                    continue
                }
                let range = AttachmentTransfer.servedRange(offset: offset, length: length, total: Int64(bytes.count),
                                                           maxLength: Int64(AttachmentWireLimits.maxRangeBytes))!
                let body = encodeAttachmentData(AttachmentDataBody(
                    hash: hash.bytes, offset: UInt64(offset), total: UInt64(bytes.count),
                    bytes: Array(bytes[Int(range.lowerBound)..<Int(range.upperBound)])))
                let data = try decodeAttachmentData(body)
                try send(.received(from: peer, AttachmentHash(bytes: data.hash)!, offset: Int64(data.offset),
                                   total: Int64(data.total), bytes: data.bytes))
            }
        }
    }

    func makeShell(_ configuration: AttachmentTransfer.Configuration = .init(rangeBytes: 64 << 10)) throws -> (Shell, String) {
        let directory = try makeTemporaryDirectory("peersync-transfer")
        return (Shell(machine: AttachmentTransfer(configuration: configuration), files: AttachmentStore(storeDirectory: directory)), directory)
    }

    func attachment(_ bytes: [UInt8]) -> Attachment {
        Attachment(contentHash: sha256(Data(bytes)), byteCount: Int64(bytes.count))
    }

    @Test("fetches a referenced, missing attachment in ranges and verifies it")
    func fetchesInRanges() throws {
        var (shell, directory) = try makeShell()
        defer { removeTemporaryDirectory(directory) }
        let bytes = Array(randomData(200_000, seed: 10))
        let cover = attachment(bytes)
        shell.peers[p1] = [cover.contentHash: bytes]
        shell.online = [p1]
        try shell.send(.referenced(cover))
        #expect(shell.requests.isEmpty)  // lazy: no peer known yet
        try shell.send(.peerConnected(p1))
        #expect(shell.requests == [.request(p1, cover.contentHash, offset: 0, length: 65_536)])
        try shell.pump()
        #expect(shell.files.contains(cover.contentHash))
        #expect(try shell.files.data(for: cover.contentHash) == Data(bytes))
        #expect(shell.files.partialSize(of: cover.contentHash) == nil)
        let ranges = shell.log.compactMap { action -> Int64? in
            if case .request(_, _, let offset, _) = action { offset } else { nil }
        }
        #expect(ranges == [0, 65_536, 131_072, 196_608])
        #expect(shell.machine.pending.isEmpty && shell.machine.requestsInFlight == 0)
    }

    @Test("an interrupted transfer resumes from the bytes in the .partial file, also after a restart")
    func resumesFromPartial() throws {
        var (shell, directory) = try makeShell()
        defer { removeTemporaryDirectory(directory) }
        let bytes = Array(randomData(300_000, seed: 11))
        let note = attachment(bytes)
        shell.peers = [p1: [note.contentHash: bytes], p2: [note.contentHash: bytes]]
        shell.online = [p1]
        try shell.send(.referenced(note))
        try shell.send(.peerConnected(p1))
        shell.answerBudget = 2  // two ranges arrive, then the connection goes silent
        try shell.pump()
        try shell.send(.peerDisconnected(p1))
        #expect(shell.files.partialSize(of: note.contentHash) == 131_072)
        #expect(!shell.files.contains(note.contentHash))

        // The app restarts: a new machine learns what is on disk and resumes there, from another peer.
        shell.machine = AttachmentTransfer(configuration: .init(rangeBytes: 64 << 10))
        shell.requests = []
        shell.log = []
        shell.answerBudget = .max
        for (hash, size) in shell.files.partialFiles() { try shell.send(.partialOnDisk(hash, bytes: size)) }
        try shell.send(.referenced(note))
        shell.online = [p2]
        try shell.send(.peerConnected(p2))
        #expect(shell.requests.first == .request(p2, note.contentHash, offset: 131_072, length: 65_536))
        try shell.pump()
        #expect(try shell.files.data(for: note.contentHash) == Data(bytes))
        let requested = shell.log.reduce(Int64(0)) { total, action in
            if case .request(_, _, _, let length) = action { total + length } else { total }
        }
        #expect(requested == 300_000 - 131_072)  // nothing fetched twice
    }

    @Test("bytes that do not hash right are discarded and fetched again, from another peer if one keeps failing")
    func mismatchRefetches() throws {
        var (shell, directory) = try makeShell(.init(rangeBytes: 64 << 10, maxFailuresPerPeer: 1))
        defer { removeTemporaryDirectory(directory) }
        let bytes = Array(randomData(100_000, seed: 12))
        var corrupt = bytes
        corrupt[50_000] ^= 0xff
        let voice = attachment(bytes)
        shell.peers = [p1: [voice.contentHash: corrupt], p2: [voice.contentHash: bytes]]
        shell.online = [p1, p2]
        try shell.send(.referenced(voice))
        try shell.send(.peerConnected(p1))
        try shell.pump()
        // p1's bytes failed verification: discarded, and p1 is not asked again.
        #expect(shell.log.contains(.discardPartial(voice.contentHash)))
        #expect(!shell.files.contains(voice.contentHash))
        #expect(shell.machine.pending == [voice.contentHash])
        try shell.send(.peerConnected(p2))
        #expect(shell.requests.first == .request(p2, voice.contentHash, offset: 0, length: 65_536))
        try shell.pump()
        #expect(try shell.files.data(for: voice.contentHash) == Data(bytes))
    }

    @Test("requests only attachments that are referenced and missing; respects the bounds")
    func lazyAndBounded() throws {
        var (shell, directory) = try makeShell(.init(rangeBytes: 1_000, maxConcurrentRequests: 2, maxAttachmentBytes: 50_000))
        defer { removeTemporaryDirectory(directory) }
        let blobs = (0..<5).map { Array(randomData(3_000, seed: 20 + UInt64($0))) }
        let attachments = blobs.map { attachment($0) }
        let local = attachments[0]
        _ = try shell.files.add(Data(blobs[0]), mediaType: "x", maxBytes: 1 << 20)
        let huge = Attachment(contentHash: sha256(Data("huge".utf8)), byteCount: 60_000)
        shell.peers[p1] = Dictionary(uniqueKeysWithValues: zip(attachments.map(\.contentHash), blobs))
        shell.online = [p1]
        try shell.send(.peerConnected(p1))
        try shell.send(.availableLocally(local.contentHash))
        for attachment in attachments + [huge] { try shell.send(.referenced(attachment)) }
        try shell.send(.unreferenced(attachments[4].contentHash))  // no longer needed before it started
        #expect(shell.machine.refused == [huge.contentHash])
        #expect(shell.machine.requestsInFlight == 2)  // bounded
        #expect(Set(shell.machine.pending) == Set(attachments[1...3].map(\.contentHash)))
        var maxInFlight = 0
        while !shell.requests.isEmpty {
            maxInFlight = max(maxInFlight, shell.machine.requestsInFlight)
            shell.answerBudget = 1
            try shell.pump()
        }
        #expect(maxInFlight == 2)
        let requested = Set(shell.log.compactMap { action -> AttachmentHash? in
            if case .request(_, let hash, _, let length) = action {
                #expect(length <= 1_000)
                return hash
            }
            return nil
        })
        #expect(requested == Set(attachments[1...3].map(\.contentHash)))
        for attachment in attachments[1...3] { #expect(shell.files.contains(attachment.contentHash)) }
        #expect(!shell.files.contains(attachments[4].contentHash))
    }

    @Test("a peer that lacks it is skipped; late and unsolicited data are ignored")
    func lacksAndStrayData() throws {
        var (shell, directory) = try makeShell()
        defer { removeTemporaryDirectory(directory) }
        let bytes = Array(randomData(10_000, seed: 30))
        let a = attachment(bytes)
        shell.peers = [p1: [:], p2: [a.contentHash: bytes]]
        shell.online = [p1, p2]
        try shell.send(.peerConnected(p1))
        try shell.send(.referenced(a))
        #expect(shell.requests == [.request(p1, a.contentHash, offset: 0, length: 10_000)])
        // Data nobody asked for changes nothing.
        #expect(shell.machine.handle(.received(from: p2, a.contentHash, offset: 0, total: 10_000, bytes: [1, 2, 3])).isEmpty)
        try shell.pump()  // p1 answers "unavailable"
        try shell.send(.peerConnected(p2))
        try shell.pump()
        #expect(try shell.files.data(for: a.contentHash) == Data(bytes))
        // Data for a finished transfer is ignored.
        #expect(shell.machine.handle(.received(from: p2, a.contentHash, offset: 0, total: 10_000, bytes: [1])).isEmpty)
    }

    @Test("attachment messages round-trip and refuse what is out of bounds")
    func messages() throws {
        let hash = Array(repeating: UInt8(7), count: 32)
        let request = AttachmentRequestBody(hash: hash, offset: 262_144, length: 262_144)
        #expect(try decodeAttachmentRequest(encodeAttachmentRequest(request)) == request)
        let data = AttachmentDataBody(hash: hash, offset: 10, total: 13, bytes: [1, 2, 3])
        #expect(try decodeAttachmentData(encodeAttachmentData(data)) == data)
        #expect(try decodeAttachmentUnavailable(encodeAttachmentUnavailable(hash: hash)) == hash)
        #expect(try decodeAttachmentData(encodeAttachmentData(AttachmentDataBody(hash: hash, offset: 0, total: 0, bytes: []))).total == 0)
        // A 256 KiB data message with its fields stays far below the frame limit.
        let full = encodeAttachmentData(AttachmentDataBody(hash: hash, offset: 0, total: 1 << 30, bytes: Array(repeating: 0, count: 256 << 10)))
        #expect(full.count < 256 << 10 + 64)

        #expect(throws: WireError.self) { try decodeAttachmentRequest(encodeAttachmentRequest(.init(hash: [1, 2], offset: 0, length: 1))) }
        #expect(throws: WireError.self) { try decodeAttachmentRequest(encodeAttachmentRequest(.init(hash: hash, offset: 0, length: 0))) }
        #expect(throws: WireError.self) { try decodeAttachmentRequest(encodeAttachmentRequest(.init(hash: hash, offset: 0, length: 2 << 20))) }
        #expect(throws: WireError.self) { try decodeAttachmentData(encodeAttachmentData(.init(hash: hash, offset: 12, total: 13, bytes: [1, 2]))) }
        #expect(throws: WireError.self) { try decodeAttachmentData(encodeAttachmentData(.init(hash: hash, offset: 0, total: 5, bytes: []))) }
        #expect(throws: WireError.self) { try decodeAttachmentData([0x0a, 0x20]) }  // truncated
        #expect(throws: WireError.missingField(message: "attachmentUnavailable", field: "hash")) { try decodeAttachmentUnavailable([]) }
    }
}
