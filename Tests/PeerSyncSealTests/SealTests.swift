import Crypto
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
@testable import PeerSyncSeal
import Testing

/// Sealed data for relays (issue 33): what a relay holds opens only with the group's data key
/// of its epoch, and only as its writer sealed it.
@Suite("Sealed blobs and key envelopes")
struct SealTests {
    let group = GroupID(bytes: (0xa0...0xaf).map { UInt8($0) })!
    let anna = DeviceKey.generate()
    let ben = DeviceKey.generate()
    let carla = DeviceKey.generate()
    let replica = ReplicaID(high: 1, low: 2)
    let plaintext = Array("a delta: shifts/… note = bring keys".utf8)

    @Test func aBlobOpensOnlyWithItsEpochsKeyAndAsItsWriterSealedIt() throws {
        let key = DataKey.generate(epoch: 3)
        let blob = try SealedBlob.seal(plaintext, group: group, key: key, writer: anna, replica: replica, counters: 5...7, head: 9)
        let parsed = try SealedBlob(bytes: blob.bytes)
        #expect(parsed == blob)
        #expect(parsed.isSigned(by: anna.publicKey))
        #expect(!parsed.isSigned(by: ben.publicKey))
        #expect(try parsed.open(with: key, group: group) == plaintext)
        #expect((parsed.firstCounter, parsed.lastCounter, parsed.head, parsed.epoch) == (5, 7, 9, 3))
        // No plaintext in what the relay stores.
        #expect(!blob.bytes.contains(subsequence: Array("bring keys".utf8)))
        // Another epoch's key, another group: refused.
        #expect(throws: SealError.self) { try parsed.open(with: DataKey.generate(epoch: 3), group: group) }
        #expect(throws: SealError.self) { try parsed.open(with: DataKey(epoch: 4, bytes: key.bytes)!, group: group) }
        #expect(throws: SealError.self) { try parsed.open(with: key, group: GroupID(bytes: [UInt8](repeating: 1, count: 16))!) }
    }

    @Test func alteredReplayedOrMisattributedBlobsAreRefused() throws {
        let key = DataKey.generate(epoch: 0)
        let blob = try SealedBlob.seal(plaintext, group: group, key: key, writer: anna, replica: replica, counters: 1...1, head: 1)
        // One bit of the ciphertext flipped: the signature fails, and so does the AEAD.
        var altered = blob.bytes
        altered[altered.count - 70] ^= 1
        let tampered = try SealedBlob(bytes: altered)
        #expect(!tampered.isSigned(by: anna.publicKey))
        #expect(throws: SealError.self) { try tampered.open(with: key, group: group) }
        // Re-signed by Ben as if he wrote it: the header names him, so the AEAD (bound to the
        // header) does not open; with Anna's header it is not his signature.
        let stolen = SealedBlob(kind: blob.kind, groupID: group, epoch: 0, keyID: key.id, writer: ben.deviceID, replica: replica, firstCounter: 1,
                                lastCounter: 1, head: 1, nonce: blob.nonce, covers: [:], ciphertext: blob.ciphertext, signature: [])
        let resigned = SealedBlob(kind: stolen.kind, groupID: group, epoch: 0, keyID: key.id, writer: ben.deviceID, replica: replica, firstCounter: 1,
                                  lastCounter: 1, head: 1, nonce: blob.nonce, covers: [:], ciphertext: blob.ciphertext,
                                  signature: ben.signature(for: stolen.signed))
        #expect(resigned.isSigned(by: ben.publicKey))
        #expect(throws: SealError.self) { try resigned.open(with: key, group: group) }
        // Replayed into another group (its header rewritten and re-signed by a member there).
        let other = GroupID(bytes: [UInt8](repeating: 7, count: 16))!
        let moved = SealedBlob(kind: blob.kind, groupID: other, epoch: 0, keyID: key.id, writer: anna.deviceID, replica: replica, firstCounter: 1,
                               lastCounter: 1, head: 1, nonce: blob.nonce, covers: [:], ciphertext: blob.ciphertext, signature: [])
        #expect(throws: SealError.self) { try moved.open(with: key, group: other) }
        // Other counters than sealed: does not open.
        let shifted = SealedBlob(kind: blob.kind, groupID: group, epoch: 0, keyID: key.id, writer: anna.deviceID, replica: replica, firstCounter: 2,
                                 lastCounter: 2, head: 2, nonce: blob.nonce, covers: [:], ciphertext: blob.ciphertext, signature: [])
        #expect(throws: SealError.self) { try shifted.open(with: key, group: group) }
    }

    @Test func aRemovedDeviceCannotReadWhatIsWrittenAfterItsRemoval() throws {
        // Epoch 0: all three have the key. Carla is removed: epoch 1's key goes to Anna and Ben only.
        let first = DataKey.generate(epoch: 0)
        let second = DataKey.generate(epoch: 1)
        let envelopes = try [anna, ben].map { try KeyEnvelope.seal(second, group: group, to: $0.publicKey, by: anna) }
        for (device, envelope) in zip([anna, ben], envelopes) {
            let parsed = try KeyEnvelope(bytes: envelope.bytes)
            #expect(parsed.isSigned(by: anna.publicKey))
            #expect(try parsed.open(with: device, group: group) == second)
            #expect(throws: SealError.self) { try parsed.open(with: carla, group: group) }
        }
        let after = try SealedBlob.seal(plaintext, group: group, key: second, writer: ben, replica: replica, counters: 10...10, head: 10)
        // Carla holds every blob and every envelope, and epoch 0's key: nothing opens it.
        #expect(throws: SealError.self) { try after.open(with: first, group: group) }
        for envelope in envelopes { #expect(throws: SealError.self) { try envelope.open(with: carla, group: group) } }
        // An envelope's recipient field rewritten to Carla: HPKE does not open it with her key.
        let redirected = KeyEnvelope(groupID: group, epoch: 1, recipient: carla.deviceID, sender: anna.deviceID,
                                     encapsulatedKey: envelopes[0].encapsulatedKey, ciphertext: envelopes[0].ciphertext, signature: [])
        #expect(throws: SealError.self) { try redirected.open(with: carla, group: group) }
    }

    /// Two admins start epoch 5 at once: two keys. A blob names the one it was sealed with.
    @Test func concurrentKeysOfOneEpochAreToldApartByTheirID() throws {
        let mine = DataKey.generate(epoch: 5)
        let theirs = DataKey.generate(epoch: 5)
        #expect(mine.id != theirs.id && mine.id.count == 8)
        let blob = try SealedBlob.seal(plaintext, group: group, key: theirs, writer: ben, replica: replica, counters: 1...1, head: 1)
        #expect(blob.keyID == theirs.id)
        #expect(throws: SealError.self) { try blob.open(with: mine, group: group) }
        let key = try #require([mine, theirs].first { $0.epoch == blob.epoch && $0.id == blob.keyID })
        #expect(try blob.open(with: key, group: group) == plaintext)
    }

    @Test func snapshotsNameWhatTheyCover() throws {
        let key = DataKey.generate(epoch: 2)
        let covers = [replica: UInt64(40), ReplicaID(high: 9, low: 9): 3]
        let snapshot = try SealedBlob.seal(plaintext, kind: .snapshot, group: group, key: key, writer: anna, replica: replica,
                                           counters: 40...40, head: 40, covers: covers)
        let parsed = try SealedBlob(bytes: snapshot.bytes)
        #expect(parsed.kind == .snapshot && parsed.covers == covers)
        #expect(try parsed.open(with: key, group: group) == plaintext)
    }

    @Test func malformedBytesAreRefusedWithOneLine() throws {
        let key = DataKey.generate(epoch: 0)
        let blob = try SealedBlob.seal(plaintext, group: group, key: key, writer: anna, replica: replica, counters: 1...2, head: 2)
        for cut in [0, 1, 10, 40, blob.bytes.count - 1] {
            #expect(throws: SealError.self) { try SealedBlob(bytes: Array(blob.bytes.prefix(cut))) }
        }
        #expect(throws: SealError.self) { try SealedBlob(bytes: blob.bytes + [0]) }
        var badFormat = blob.bytes
        badFormat[0] = 9
        do {
            _ = try SealedBlob(bytes: badFormat)
            Issue.record("an unknown format was accepted")
        } catch {
            #expect(error.description == "malformed sealed data: sealed blob: unknown format")
        }
        #expect(throws: SealError.self) { try KeyEnvelope(bytes: [1, 2, 3]) }
    }
}

extension Array where Element == UInt8 {
    func contains(subsequence: [UInt8]) -> Bool {
        guard subsequence.count <= count else { return false }
        return (0...(count - subsequence.count)).contains { Array(self[$0..<($0 + subsequence.count)]) == subsequence }
    }
}
