import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncRelay
import PeerSyncReplication
@testable import PeerSyncSeal
import Testing

/// The relay's pure parts (docs/PROTOCOL.md §20.3–20.5): messages, member lists, a group's
/// decisions, and a device's ledger — no sockets, no clocks.
@Suite("Relay decisions")
struct RelayDecisionTests {
    let group = GroupID(bytes: Array(repeating: 7, count: 16))!
    let admin = DeviceKey.generate()
    let member = DeviceKey.generate()
    let stranger = DeviceKey.generate()
    let relay = DeviceKey.generate()
    let key = DataKey.generate(epoch: 0)
    let replicaA = ReplicaID(bigEndianBytes: Array(repeating: 1, count: 16))!
    let replicaB = ReplicaID(bigEndianBytes: Array(repeating: 2, count: 16))!

    func members(_ sequence: UInt64 = 1, without: DeviceKey? = nil, signer: DeviceKey? = nil) -> RelayMembers {
        var list: [DevicePublicKey: DeviceRole] = [admin.publicKey: .admin, member.publicKey: .member, relay.publicKey: .relay]
        if let without { list[without.publicKey] = nil }
        return RelayMembers.sign(group: group, sequence: sequence, members: list, by: signer ?? admin)
    }

    func blob(_ writer: DeviceKey, _ replica: ReplicaID, _ counters: ClosedRange<UInt64>, kind: SealedBlob.Kind = .writes,
              covers: [ReplicaID: UInt64] = [:], size: Int = 10) throws -> SealedBlob {
        try SealedBlob.seal(Array(repeating: 0, count: size), kind: kind, group: group, key: key, writer: writer, replica: replica,
                            counters: counters, head: counters.upperBound, covers: covers)
    }

    @Test func messagesRoundTripAndMalformedOnesSayWhy() throws {
        let messages: [RelayMessage] = [
            .hello(group: group, members: members(), enrolSecret: Array(repeating: 3, count: 16)),
            .hello(group: group, members: nil, enrolSecret: nil),
            .upload(try blob(member, replicaA, 1...3)), .want([replicaA: 3, replicaB: 0]), .members(members(2)),
            .keys([try KeyEnvelope.seal(key, group: group, to: member.publicKey, by: admin)]), .ping(9), .pong(9),
            .welcome(members: members(), blobs: 2, bytes: 300, covered: [replicaA: 4]), .blob(try blob(member, replicaB, 2...2)),
            .stored(replica: replicaA, last: 3, snapshot: false), .caughtUp(5), .refused(.notMember, "no"), .notice(.overBytes, "full"),
        ]
        for message in messages {
            let frame = message.frame
            let (type, body) = try #require(FrameSplitterShim(frame).next())
            #expect(try RelayMessage.decode(type: type, body: body) == message)
        }
        #expect(throws: SealError.self) { try RelayMessage.decode(type: 99, body: []) }
        #expect(throws: SealError.self) { try RelayMessage.decode(type: RelayMessage.Kind.want.rawValue, body: [1, 2]) }
        let stale = [UInt8(2)] + group.bytes + [0, 0]
        #expect(throws: SealError.malformed("relay protocol version 2, this side speaks 1")) {
            try RelayMessage.decode(type: RelayMessage.Kind.hello.rawValue, body: stale)
        }
    }

    @Test func memberListsVerifyAndRefuseForgeries() throws {
        let list = members()
        #expect(list.isSelfSigned)
        #expect(try RelayMembers(bytes: list.bytes) == list)
        let forged = RelayMembers.sign(group: group, sequence: 5, members: [stranger.publicKey: .admin], by: stranger)
        #expect(forged.isSelfSigned)  // self-consistent, but no admin of the held list signed it
        let state = RelayGroup(members: list)
        #expect(state.decide(members: forged, relay: relay.deviceID) == .refuse(.notMember, "the member list is signed by \(stranger.deviceID.shortForm), not an admin of the list held (1)"))
        #expect(state.decide(members: members(1), relay: relay.deviceID) == .stale)
        #expect(state.decide(members: members(2, without: member), relay: relay.deviceID) == .take)
        #expect(state.decide(members: members(3, without: relay), relay: relay.deviceID) == .relayRemoved)
        #expect(state.admits(member.deviceID) && state.admits(admin.deviceID))
        #expect(!state.admits(relay.deviceID) && !state.admits(stranger.deviceID))
        var bytes = list.bytes
        bytes[bytes.count - 1] ^= 1
        #expect(!(try RelayMembers(bytes: bytes)).isSelfSigned)
    }

    @Test func uploadsAreStoredOnceCoveredInOrderAndRefusedOverQuota() throws {
        var state = RelayGroup(members: members())
        var limits = SyncLimits()
        limits.relayGroupBlobs = 3
        let first = try blob(member, replicaA, 1...3)
        #expect(state.decide(first, from: member.deviceID, limits: limits) == .store(dropping: []))
        state.stored(StoredBlobInfo(id: 1, blob: first))
        #expect(state.covered[replicaA] == 3)
        #expect(state.decide(try blob(member, replicaA, 2...3), from: member.deviceID, limits: limits) == .duplicate)
        // A gap: stored, but the coverage waits for the missing counters.
        let gap = try blob(member, replicaA, 6...7)
        state.stored(StoredBlobInfo(id: 2, blob: gap))
        #expect(state.covered[replicaA] == 3)
        let fill = try blob(admin, replicaA, 4...5)
        #expect(state.decide(fill, from: admin.deviceID, limits: limits) == .store(dropping: []))
        state.stored(StoredBlobInfo(id: 3, blob: fill))
        #expect(state.covered[replicaA] == 7)
        #expect(state.plan(for: [:]) == [1, 3, 2])
        #expect(state.plan(for: [replicaA: 3]) == [3, 2])
        // Over the blob quota: refused, nothing dropped.
        guard case .refuse(.overBlobs, _) = state.decide(try blob(member, replicaB, 1...1), from: member.deviceID, limits: limits) else {
            Issue.record("not refused over the blob quota")
            return
        }
        // Strangers and forgeries.
        guard case .refuse(.notMember, _) = state.decide(try blob(stranger, replicaB, 1...1), from: stranger.deviceID, limits: limits) else {
            Issue.record("a stranger's blob was not refused")
            return
        }
        let genuine = try blob(member, replicaB, 1...1)
        let reattributed = SealedBlob(kind: genuine.kind, groupID: group, epoch: 0, keyID: genuine.keyID, writer: admin.deviceID, replica: replicaB,
                                      firstCounter: 1, lastCounter: 1, head: 1, nonce: genuine.nonce, covers: [:],
                                      ciphertext: genuine.ciphertext, signature: genuine.signature)
        guard case .refuse(.badSignature, _) = state.decide(reattributed, from: member.deviceID, limits: SyncLimits()) else {
            Issue.record("a re-attributed blob was not refused")
            return
        }
        // A byte quota refusal names the numbers.
        limits = SyncLimits()
        limits.relayGroupBytes = state.byteCount + 50
        guard case .refuse(.overBytes, let text) = state.decide(try blob(member, replicaB, 1...1, size: 100), from: member.deviceID, limits: limits) else {
            Issue.record("not refused over the byte quota")
            return
        }
        #expect(text.contains("quota"))
    }

    @Test func aSnapshotDropsWhatItCoversAndIsSentFirstToADeviceThatLacksIt() throws {
        var state = RelayGroup(members: members())
        for (id, range) in [(1, 1...2), (2, 3...4), (3, 5...6)] as [(Int64, ClosedRange<UInt64>)] {
            state.stored(StoredBlobInfo(id: id, blob: try blob(member, replicaA, range)))
        }
        state.stored(StoredBlobInfo(id: 4, blob: try blob(admin, replicaB, 1...1)))
        let snapshot = try blob(admin, replicaB, 1...1, kind: .snapshot, covers: [replicaA: 4, replicaB: 1])
        #expect(state.decide(snapshot, from: admin.deviceID, limits: SyncLimits()) == .store(dropping: [1, 2, 4]) ||
                state.decide(snapshot, from: admin.deviceID, limits: SyncLimits()) == .store(dropping: [4, 1, 2]))
        guard case .store(let dropping) = state.decide(snapshot, from: admin.deviceID, limits: SyncLimits()) else { return }
        state.stored(StoredBlobInfo(id: 5, blob: snapshot), dropping: dropping)
        #expect(state.blobCount == 2)
        #expect(state.covered == [replicaA: 6, replicaB: 1])
        #expect(state.plan(for: [:]) == [5, 3])
        #expect(state.plan(for: [replicaA: 4, replicaB: 1]) == [3])
        // An older snapshot is refused.
        let older = try blob(admin, replicaB, 1...1, kind: .snapshot, covers: [replicaA: 2])
        guard case .refuse = state.decide(older, from: admin.deviceID, limits: SyncLimits()) else {
            Issue.record("an older snapshot was taken")
            return
        }
    }

    @Test func theLedgerUploadsWhatTheRelayLacksAndNamesAGapOnlyAfterTheBound() {
        var ledger = RelayLedger()
        ledger.welcomed(covered: [replicaA: 3])
        #expect(ledger.uploads(held: [replicaA: 5, replicaB: 2]).map(\.after) == [3, 0])
        ledger.uploading(replicaA, through: 5)
        #expect(ledger.uploads(held: [replicaA: 5, replicaB: 2]).map(\.replica) == [replicaB])
        ledger.stored(replicaA, through: 5)
        #expect(ledger.relayHolds[replicaA] == 5 && ledger.uploaded[replicaA] == nil)
        // A blob with head 9 while the device holds only 6: a gap 7–9.
        ledger.received(replica: replicaB, first: 1, last: 6, head: 9, covers: [:])
        #expect(ledger.withheld(held: [replicaB: 6], now: .seconds(0), bound: .seconds(30)).isEmpty)  // not caught up yet
        ledger.answeredWant()
        #expect(ledger.withheld(held: [replicaB: 6], now: .seconds(1), bound: .seconds(30)).isEmpty)
        #expect(ledger.withheld(held: [replicaB: 6], now: .seconds(30), bound: .seconds(30)).isEmpty)
        let found = ledger.withheld(held: [replicaB: 6], now: .seconds(31), bound: .seconds(30))
        #expect(found.map(\.description) == ["writer \(replicaB.shortDescription)'s counters 7–9"])
        #expect(ledger.withheld(held: [replicaB: 9], now: .seconds(32), bound: .seconds(30)).isEmpty)
    }
}

/// Splits one encoded frame (as the relay's and device's decoders do).
struct FrameSplitterShim {
    let bytes: [UInt8]
    init(_ bytes: [UInt8]) { self.bytes = bytes }
    func next() -> (UInt8, [UInt8])? {
        var length: UInt64 = 0
        var shift: UInt64 = 0
        var index = 0
        while index < bytes.count {
            let byte = bytes[index]
            length |= UInt64(byte & 0x7f) << shift
            index += 1
            if byte & 0x80 == 0 { break }
            shift += 7
        }
        guard index < bytes.count, Int(length) == bytes.count - index else { return nil }
        return (bytes[index], Array(bytes[(index + 1)...]))
    }
}
