import Crypto
import Foundation
@_spi(Engine) import PeerSyncCRDT
@testable import PeerSyncIdentity
import PeerSyncTestSupport
import Testing

func ts(_ ms: UInt64, _ logical: UInt16 = 0) -> HLCTimestamp { HLCTimestamp(physicalMilliseconds: ms, logical: logical) }

/// A roster under construction: entries signed by test devices at chosen times.
struct Scenario {
    let creator: DeviceKey
    let groupID: GroupID
    var entries: [RosterEntry]

    init(creator: DeviceKey = .generate(), at ms: UInt64 = 1_000, groupName: String = "Ward 7") throws {
        self.creator = creator
        let genesis = try RosterEntry.genesis(groupName: groupName, creatorName: "creator", timestamp: ts(ms), creator: creator)
        groupID = genesis.groupID
        entries = [genesis]
    }

    var roster: Roster { Roster(groupID: groupID, entries: entries) }

    /// Signs `payload` by `key` at `ms`, as a replica holding `visible` (default: every entry so
    /// far) would: `previous` is the signer's latest entry among those.
    @discardableResult
    mutating func sign(_ payload: RosterPayload, by key: DeviceKey, at ms: UInt64, seeing visible: [RosterEntry]? = nil) throws
        -> RosterEntry
    {
        let view = Roster(groupID: groupID, entries: visible ?? entries)
        let entry = try RosterEntry.make(payload, context: view.context(for: key.deviceID, at: ts(ms)), signer: key)
        entries.append(entry)
        return entry
    }

    @discardableResult
    mutating func add(_ key: DeviceKey, name: String, role: DeviceRole = .member, by admin: DeviceKey, at ms: UInt64) throws
        -> RosterEntry
    {
        try sign(.add(device: key.publicKey, name: name, role: role), by: admin, at: ms)
    }
}

/// `body` signed by `key` the way entries are, for hand-made (possibly malformed) bodies.
func signed(_ body: [UInt8], by key: DeviceKey) -> [UInt8] {
    body + key.signature(for: RosterEntry.signatureDomain + body)
}

@Suite("Identity: roster entry encoding")
struct RosterEntryEncodingTests {
    /// One entry of every kind (legacy kinds in a legacy group).
    func everyKind() throws -> [RosterEntry] {
        var s = try Scenario()
        let admin = s.creator
        let member = DeviceKey.generate()
        let token = InviteToken.generate()
        let joiner = DeviceKey.generate()
        try s.add(member, name: "Bob's phone", by: admin, at: 2_000)
        try s.sign(.remove(device: member.deviceID, dataCutoff: [ReplicaID(high: 9, low: 1): 7, ReplicaID(high: 1, low: 2): 0],
                           rosterHeads: [RosterEntryID(bytes: [UInt8](repeating: 3, count: 16))!]), by: admin, at: 2_100)
        try s.sign(.rename(device: admin.deviceID, name: "Ana — desk ✓"), by: admin, at: 2_200)
        try s.sign(.invite(token.hash, role: .admin, expiresAt: 1_900_000_000_000), by: admin, at: 2_300)
        try s.sign(.revokeInvite(token.hash), by: admin, at: 2_400)
        try s.sign(.enrol(token: token, name: "joiner"), by: joiner, at: 2_500)
        try s.sign(.writer(ReplicaID(high: .max, low: 42)), by: admin, at: 2_600)
        try s.sign(.closeLegacy(counted: [RosterEntryID(bytes: [UInt8](repeating: 5, count: 16))!]), by: admin, at: 2_700)
        let legacy = LegacyGroupKey(groupSecret: [UInt8](repeating: 7, count: 20))
        let legacyGenesis = try RosterEntry.legacyGenesis(groupName: "Old group", timestamp: ts(900), legacyKey: legacy)
        let legacyEnrol = try RosterEntry.legacyEnrol(
            name: "upgraded", context: RosterEntryContext(groupID: legacy.groupID, timestamp: ts(950), previous: nil),
            device: .generate(), legacyKey: legacy)
        return s.entries + [legacyGenesis, legacyEnrol]
    }

    @Test("every kind round-trips through bytes and through its _roster record")
    func roundTrip() throws {
        let entries = try everyKind()
        #expect(Set(entries.map(\.kind)) == Set(RosterEntry.Kind.allCases))
        for entry in entries {
            let decoded = try RosterEntry(bytes: entry.bytes)
            #expect(decoded == entry)
            #expect(decoded.payload == entry.payload)
            #expect(decoded.id == entry.id)
            #expect(entry.id.bytes == Array(SHA256.hash(data: entry.bytes).prefix(16)))
            #expect(entry.recordKey == RecordKey(collection: "_roster", id: entry.id.uuid))
            #expect(entry.fields == ["e": .bytes(entry.bytes)])
            #expect(try RosterEntry(recordID: entry.recordKey.id, fields: entry.fields) == entry)
        }
        let genesis = entries[0]
        #expect(genesis.groupID.bytes == genesis.id.bytes)
    }

    @Test("the body layout is the documented one (writer entry)")
    func layout() throws {
        let key = try DeviceKey(privateKey: P256.Signing.PrivateKey(rawRepresentation: DeviceIDTests.vectorScalar))
        let group = GroupID(bytes: Array(0..<16))!
        let previous = RosterEntryID(bytes: [UInt8](repeating: 0xee, count: 16))!
        let entry = try RosterEntry.make(.writer(ReplicaID(high: 0x0102030405060708, low: 0x090a0b0c0d0e0f10)),
                                         context: RosterEntryContext(groupID: group, timestamp: ts(1, 2), previous: previous),
                                         signer: key)
        var expected: [UInt8] = [1, 8] + Array(0..<16)
        expected += [0x82, 0x80, 0x04] // varint(0x10002): physical 1 ms, logical 2
        expected += key.publicKey.x963
        expected += [UInt8](repeating: 0xee, count: 16)
        expected += Array(1...16)
        #expect(Array(entry.bytes.dropLast(64)) == expected)
        #expect(entry.bytes.count == expected.count + 64)
        #expect(key.publicKey.isValidSignature(entry.signature, for: Array("peersync roster entry v1".utf8) + [0] + expected))
    }

    @Test("every truncation, a trailing byte and every flipped bit are refused")
    func corruption() throws {
        let key = DeviceKey.generate()
        let entry = try RosterEntry.make(.writer(ReplicaID(high: 1, low: 2)),
                                         context: RosterEntryContext(groupID: GroupID(bytes: Array(0..<16))!, timestamp: ts(5),
                                                                     previous: nil), signer: key)
        for length in 0..<entry.bytes.count {
            #expect(throws: RosterEntryError.self) { try RosterEntry(bytes: Array(entry.bytes.prefix(length))) }
        }
        #expect(throws: RosterEntryError.trailingBytes(1)) { try RosterEntry(bytes: entry.bytes + [0]) }
        var refused = 0
        for bit in 0..<(entry.bytes.count * 8) {
            var bytes = entry.bytes
            bytes[bit / 8] ^= UInt8(1 << (bit % 8))
            do {
                _ = try RosterEntry(bytes: bytes)
            } catch {
                refused += 1
            }
        }
        #expect(refused == entry.bytes.count * 8)
        // Signature bits in particular give badSignature.
        var bytes = entry.bytes
        bytes[bytes.count - 1] ^= 1
        #expect(throws: RosterEntryError.badSignature) { try RosterEntry(bytes: bytes) }
    }

    @Test("re-signed malformed bodies are refused for the right reason")
    func malformedBodies() throws {
        let key = DeviceKey.generate()
        let group = GroupID(bytes: Array(0..<16))!
        let good = RosterEntry.encodeBody(.writer(ReplicaID(high: 1, low: 2)), groupID: group, timestamp: ts(5),
                                          signer: key.publicKey, previous: nil)
        var body = good
        body[1] = 12
        #expect(throws: RosterEntryError.unknownKind(12)) { try RosterEntry(bytes: signed(body, by: key)) }
        body = good
        body[0] = 2
        #expect(throws: RosterEntryError.unsupportedFormat(2)) { try RosterEntry(bytes: signed(body, by: key)) }
        // An overlong varint (timestamp 0 written as 80 00 instead of 00).
        let zero = RosterEntry.encodeBody(.writer(ReplicaID(high: 1, low: 2)), groupID: group, timestamp: .zero,
                                          signer: key.publicKey, previous: nil)
        #expect(zero[18] == 0)
        body = Array(zero[..<18]) + [0x80, 0x00] + Array(zero[19...])
        #expect(throws: RosterEntryError.nonCanonical) { try RosterEntry(bytes: signed(body, by: key)) }
        // A signer key that is not a point on the curve.
        body = good
        body[30] ^= 0xff
        #expect(throws: RosterEntryError.badPublicKey("signer")) { try RosterEntry(bytes: signed(body, by: key)) }
        // A name over 200 bytes, a control character, an empty name.
        for (name, problem) in [(String(repeating: "x", count: 201), "it has 201 bytes, at most 200 are allowed"),
                                ("bad\nname", "it contains a control character"), ("", "it is empty")] {
            let renameBody = RosterEntry.encodeBody(.rename(device: key.deviceID, name: name), groupID: group,
                                                    timestamp: ts(5), signer: key.publicKey, previous: nil)
            #expect(throws: RosterEntryError.badName("device name", problem)) { try RosterEntry(bytes: signed(renameBody, by: key)) }
            #expect(throws: RosterEntryError.badName("device name", problem)) {
                try RosterEntry.make(.rename(device: key.deviceID, name: name),
                                     context: RosterEntryContext(groupID: group, timestamp: ts(5), previous: nil), signer: key)
            }
        }
        // Invalid UTF-8 in a name.
        var invalid = RosterEntry.encodeBody(.rename(device: key.deviceID, name: "ab"), groupID: group, timestamp: ts(5),
                                             signer: key.publicKey, previous: nil)
        invalid[invalid.count - 1] = 0xff
        #expect(throws: RosterEntryError.badName("device name", "it is not valid UTF-8")) { try RosterEntry(bytes: signed(invalid, by: key)) }
        // A role that does not exist.
        var role = RosterEntry.encodeBody(.invite(InviteToken.generate().hash, role: .member, expiresAt: 1), groupID: group,
                                          timestamp: ts(5), signer: key.publicKey, previous: nil)
        role[role.count - 2] = 7
        #expect(throws: RosterEntryError.badRole(7)) { try RosterEntry(bytes: signed(role, by: key)) }
        // Cutoffs out of order; too many heads.
        var remove = RosterEntry.encodeBody(.remove(device: key.deviceID, dataCutoff: [:], rosterHeads: []), groupID: group,
                                            timestamp: ts(5), signer: key.publicKey, previous: nil)
        remove.removeLast(2)
        var unsorted = remove + [2]
        ReplicaID(high: 2, low: 0).appendBigEndianBytes(to: &unsorted)
        unsorted.append(1)
        ReplicaID(high: 1, low: 0).appendBigEndianBytes(to: &unsorted)
        unsorted += [1, 0]
        #expect(throws: RosterEntryError.notAscending("replica cutoffs")) { try RosterEntry(bytes: signed(unsorted, by: key)) }
        let tooMany = remove + [0, 0x81, 0x20] // 0 cutoffs, 4097 heads
        #expect(throws: RosterEntryError.tooMany("roster heads", 4_097)) { try RosterEntry(bytes: signed(tooMany, by: key)) }
        let heads = (0...4_096).map { i in RosterEntryID(bytes: [1, 0] + (0..<14).map { UInt8(truncatingIfNeeded: i >> ($0 % 2 * 8)) })! }
        #expect(throws: RosterEntryError.tooMany("roster heads", 4_097)) {
            try RosterEntry.make(.remove(device: key.deviceID, dataCutoff: [:], rosterHeads: heads),
                                 context: RosterEntryContext(groupID: group, timestamp: ts(5), previous: nil), signer: key)
        }
        // Oversized input is refused before parsing.
        #expect(throws: RosterEntryError.tooLarge(300_000)) { try RosterEntry(bytes: [UInt8](repeating: 1, count: 300_000)) }
    }

    @Test("a high-S twin of a valid signature is refused")
    func highS() throws {
        let key = DeviceKey.generate()
        let entry = try RosterEntry.make(.writer(ReplicaID(high: 1, low: 2)),
                                         context: RosterEntryContext(groupID: GroupID(bytes: Array(0..<16))!, timestamp: ts(5),
                                                                     previous: nil), signer: key)
        var s = [UInt8](repeating: 0, count: 32)
        var borrow = 0
        for j in stride(from: 31, through: 0, by: -1) {
            var digit = Int(ECDSALowS.order[j]) - Int(entry.signature[32 + j]) - borrow
            borrow = digit < 0 ? 1 : 0
            if digit < 0 { digit += 256 }
            s[j] = UInt8(digit)
        }
        let twin = Array(entry.bytes.dropLast(32)) + s
        #expect(throws: RosterEntryError.badSignature) { try RosterEntry(bytes: twin) }
    }

    @Test("a _roster record must hold its own hash's entry in exactly one bytes field")
    func records() throws {
        let entries = try everyKind()
        let entry = entries[1]
        let other = entries[2]
        #expect(throws: RosterEntryError.recordIDMismatch(recordID: other.id.uuid, contentID: entry.id.uuid)) {
            try RosterEntry(recordID: other.id.uuid, fields: entry.fields)
        }
        #expect(throws: RosterEntryError.badRecordFields(["e", "x"])) {
            try RosterEntry(recordID: entry.id.uuid, fields: ["e": .bytes(entry.bytes), "x": .null])
        }
        #expect(throws: RosterEntryError.badRecordFields(["e"])) {
            try RosterEntry(recordID: entry.id.uuid, fields: ["e": .string("not bytes")])
        }
    }

    @Test("legacy entries: the proof must verify, the group must be the legacy key's, and it signs nothing else")
    func legacyProofs() throws {
        let legacy = LegacyGroupKey(groupSecret: Array(repeating: 1, count: 20))
        let device = DeviceKey.generate()
        let context = RosterEntryContext(groupID: legacy.groupID, timestamp: ts(10), previous: nil)
        // Deterministic: the same secret gives the same key and group.
        #expect(LegacyGroupKey(groupSecret: Array(repeating: 1, count: 20)).groupID == legacy.groupID)
        #expect(LegacyGroupKey(groupSecret: Array(repeating: 2, count: 20)).groupID != legacy.groupID)
        // Another secret's key cannot enrol into this group.
        let wrong = LegacyGroupKey(groupSecret: Array(repeating: 2, count: 20))
        #expect(throws: RosterEntryError.legacyGroupMismatch) {
            try RosterEntry.legacyEnrol(name: "x", context: context, device: device, legacyKey: wrong)
        }
        // A proof made with the wrong key over the right group, carried with the right public key.
        let prefix = RosterEntry.encodeBody(.legacyEnrol(name: "x", legacyKey: legacy.publicKey, proof: []),
                                            groupID: legacy.groupID, timestamp: ts(10), signer: device.publicKey, previous: nil)
        let badProof = DeviceKey(privateKey: wrong.privateKey).signature(for: RosterEntry.legacyProofDomain + prefix)
        #expect(throws: RosterEntryError.badLegacyProof) { try RosterEntry(bytes: signed(prefix + badProof, by: device)) }
        let goodProof = DeviceKey(privateKey: legacy.privateKey).signature(for: RosterEntry.legacyProofDomain + prefix)
        #expect(try RosterEntry(bytes: signed(prefix + goodProof, by: device)).kind == .legacyEnrol)
        // The legacy key may sign only legacyGenesis.
        #expect(throws: RosterEntryError.signedByLegacyKey) {
            try RosterEntry.make(.writer(ReplicaID(high: 1, low: 1)), context: context, signer: DeviceKey(privateKey: legacy.privateKey))
        }
        // legacyGenesis must be signed by the key its group derives from.
        let forgedGenesis = RosterEntry.encodeBody(.legacyGenesis(groupName: "g"), groupID: legacy.groupID, timestamp: ts(1),
                                                   signer: device.publicKey, previous: nil)
        #expect(throws: RosterEntryError.legacyGroupMismatch) { try RosterEntry(bytes: signed(forgedGenesis, by: device)) }
        #expect(throws: RosterEntryError.wrongBuilder(.genesis)) {
            try RosterEntry.make(.genesis(groupName: "g", creatorName: "c"), context: context, signer: device)
        }
    }
}
