import Crypto
import Foundation
@_spi(Engine) import PeerSyncCRDT
@testable import PeerSyncDiscovery
@testable import PeerSyncIdentity
@testable import PeerSyncReplication
@testable import PeerSyncNetwork
@testable import PeerSyncSeal
import PeerSyncRelay
@testable import PeerSyncWire

/// Fixed inputs of every vector: replicas, keys, nonces, clocks.
enum Fixed {
    static let a = ReplicaID(high: 0x0102_0304_0506_0708, low: 0x090a_0b0c_0d0e_0f10)
    static let b = ReplicaID(high: 0x1112_1314_1516_1718, low: 0x191a_1b1c_1d1e_1f20)
    static let c = ReplicaID(high: 0x2122_2324_2526_2728, low: 0x292a_2b2c_2d2e_2f30)
    /// 2026-01-01T00:00:00Z.
    static let t0: UInt64 = 1_767_225_600_000
    static let group = GroupID(bytes: (0xa0...0xaf).map { UInt8($0) })!
    static let nonceA: [UInt8] = Array(0x00...0x0f)
    static let nonceB: [UInt8] = Array(0x10...0x1f)
    static func key(_ label: String) -> DeviceKey {
        DeviceKey(privateKey: try! P256.Signing.PrivateKey(rawRepresentation: Array(SHA256.hash(data: Array(label.utf8)))))
    }
    /// Device A's key: the private scalar is SHA-256("peersync test vector") (docs/ROSTER-DRAFT.md §1).
    static let keyA = key("peersync test vector")
    static let keyB = key("peersync test vector b")
    static let keyRelay = key("peersync test vector relay")
    static let r1 = UUID(uuidString: "00112233-4455-6677-8899-aabbccddeeff")!
    static let r2 = UUID(uuidString: "10000000-0000-4000-8000-000000000002")!
    static let r3 = UUID(uuidString: "10000000-0000-4000-8000-000000000003")!
    static func ts(_ offset: UInt64, _ logical: UInt16 = 0) -> HLCTimestamp {
        HLCTimestamp(physicalMilliseconds: t0 + offset, logical: logical)
    }
}

/// Builds every vector file from the fixed inputs with this code. `existing` holds the files as
/// they are on disk: ECDSA signatures and sealed bundles are randomized, so a stored one that
/// still verifies is kept (the files stay byte-for-byte stable).
struct VectorBuilder {
    var existing: [String: JSON]

    func build() -> [String: JSON] {
        [
            "varint.json": varints(), "frames.json": frames(), "values.json": values(), "hlc.json": hlc(),
            "context-blobs.json": contextBlobs(), "deltas.json": deltas(), "messages.json": messages(),
            "digests.json": digests(), "identity.json": identity(), "invite-codes.json": inviteCodes(),
            "auth.json": auth(), "discovery.json": discovery(), "bundles.json": bundles(), "seen.json": seen(),
            "sealed.json": sealed(),
        ]
    }

    // MARK: sealed data for relays (PROTOCOL §20)

    /// Sealed blobs (fixed key and nonce: the ciphertext is exactly reproducible; the signature
    /// is ECDSA, kept while it verifies) and a key envelope (HPKE is randomized: the stored one is
    /// kept while it opens to the key).
    func sealed() -> JSON {
        let stored = existing["sealed.json"]
        let key = DataKey(epoch: 1, bytes: (0x40..<0x60).map { UInt8($0) })!
        let nonce: [UInt8] = Array(0x70..<0x7c)
        let plaintext = Array("sealed delta plaintext".utf8)
        func blob(_ name: String, kind: SealedBlob.Kind, covers: [ReplicaID: UInt64]) -> SealedBlob {
            let fresh = try! SealedBlob.seal(plaintext, kind: kind, group: Fixed.group, key: key, writer: Fixed.keyA, replica: Fixed.a,
                                             counters: 3...4, head: 5, covers: covers, nonce: nonce)
            let old = ((stored?["blobs"] as? [JSON]) ?? []).first { ($0["name"] as? String) == name }
                .flatMap { try? SealedBlob(bytes: unhex($0["blob"])) }
            if let old, old.isSigned(by: Fixed.keyA.publicKey), Array(old.bytes.dropLast(64)) == Array(fresh.bytes.dropLast(64)) { return old }
            return fresh
        }
        let writes = blob("writes", kind: .writes, covers: [:])
        let snapshot = blob("snapshot", kind: .snapshot, covers: [Fixed.a: 4, Fixed.b: 2])
        func entry(_ name: String, _ blob: SealedBlob) -> JSON {
            ["name": name, "header": hex(blob.header), "blob": hex(blob.bytes), "signed": hex(blob.signed)]
        }
        func flipped(_ bytes: [UInt8], at offsetFromEnd: Int) -> String {
            var copy = bytes
            copy[copy.count - offsetFromEnd] ^= 1
            return hex(copy)
        }
        let otherGroup = GroupID(bytes: [UInt8](repeating: 7, count: 16))!
        let moved = SealedBlob(kind: .writes, groupID: otherGroup, epoch: 1, keyID: key.id, writer: Fixed.keyA.deviceID, replica: Fixed.a, firstCounter: 3,
                               lastCounter: 4, head: 5, nonce: nonce, covers: [:], ciphertext: writes.ciphertext, signature: [])
        let movedName = "re-signed by its writer with another group's ID in the header: it does not open under that header"
        let oldMoved = ((stored?["refused"] as? [JSON]) ?? []).first { ($0["name"] as? String) == movedName }
            .flatMap { try? SealedBlob(bytes: unhex($0["blob"])) }
        let movedSigned = oldMoved.flatMap { old in
            old.isSigned(by: Fixed.keyA.publicKey) && Array(old.bytes.dropLast(64)) == moved.bytes ? old : nil
        } ?? SealedBlob(kind: .writes, groupID: otherGroup, epoch: 1, keyID: key.id, writer: Fixed.keyA.deviceID, replica: Fixed.a,
                        firstCounter: 3, lastCounter: 4, head: 5, nonce: nonce, covers: [:], ciphertext: writes.ciphertext,
                        signature: Fixed.keyA.signature(for: moved.signed))
        let oldEnvelope = (stored?["envelope"] as? JSON)?["envelope"].flatMap { try? KeyEnvelope(bytes: unhex($0)) }
        let envelope: KeyEnvelope
        if let oldEnvelope, oldEnvelope.isSigned(by: Fixed.keyA.publicKey),
           (try? oldEnvelope.open(with: Fixed.keyB, group: Fixed.group)) == key {
            envelope = oldEnvelope
        } else {
            envelope = try! KeyEnvelope.seal(key, group: Fixed.group, to: Fixed.keyB.publicKey, by: Fixed.keyA)
        }
        return [
            "kind": "sealed",
            "description": "Sealed data for relays (PROTOCOL §20): blobs = header ‖ varint(len) ‖ ChaCha20-Poly1305(data key, nonce, plaintext, aad = header) ‖ ECDSA P-256 low-S by the writer over \"peersync sealed blob v1\" 00 ‖ header ‖ varint(len) ‖ ciphertext; key envelopes = HPKE (DHKEM(P-256, HKDF-SHA256), HKDF-SHA256, AES-256-GCM, base mode, info \"peersync data key v1\" 00 ‖ group ID ‖ varint(epoch)) of the 32-byte data key to the recipient's device key, signed by the sender. ECDSA and HPKE are randomized: check that signatures verify and envelopes open, not that you produce the same bytes. Keys: writer = device A (scalar SHA-256(\"peersync test vector\")), recipient = device B (SHA-256(\"peersync test vector b\")).",
            "groupID": hex(Fixed.group.bytes), "dataKey": ["epoch": "1", "key": hex(key.bytes)], "nonce": hex(nonce),
            "plaintext": hex(plaintext), "writerKey": hex(Fixed.keyA.publicKey.x963), "writerReplica": replicaHex(Fixed.a),
            "blobs": [entry("writes", writes), entry("snapshot", snapshot)],
            "refused": [
                ["name": "a ciphertext byte flipped: the signature fails, and the AEAD does not open", "blob": flipped(writes.bytes, at: 70),
                 "error": "badSignature"],
                ["name": movedName, "blob": hex(movedSigned.bytes), "groupID": hex(otherGroup.bytes), "error": "cannotOpen"],
                ["name": "one byte more", "blob": hex(writes.bytes + [0]), "error": "malformed"],
            ] as [JSON],
            "envelope": ["senderKey": hex(Fixed.keyA.publicKey.x963), "recipientScalar": hex(Fixed.keyB.privateKey.rawRepresentation),
                         "envelope": hex(envelope.bytes), "opensTo": hex(key.bytes), "epoch": "1"],
            "members": relayMembers(stored),
            "relayCode": ["relayDeviceID": hex(Fixed.keyRelay.deviceID.bytes), "secret": hex(Array(0xa0..<0xb0)),
                          "code": RelayCode(relay: Fixed.keyRelay.deviceID, secret: Array(0xa0..<0xb0)).description],
            "relayMessages": relayMessages(writes, envelope),
        ]
    }

    /// A member list (§20.3) signed by A: A admin, B member, the relay; kept while it verifies.
    func relayMembers(_ stored: JSON?) -> JSON {
        let list: [DevicePublicKey: DeviceRole] = [Fixed.keyA.publicKey: .admin, Fixed.keyB.publicKey: .member, Fixed.keyRelay.publicKey: .relay]
        let fresh = RelayMembers.sign(group: Fixed.group, sequence: 1_700_000_000_000, members: list, by: Fixed.keyA)
        let old = ((stored?["members"] as? JSON)?["members"]).flatMap { try? RelayMembers(bytes: unhex($0)) }
        let members = old.flatMap { $0.isSelfSigned && $0.lists(list) && $0.sequence == fresh.sequence ? $0 : nil } ?? fresh
        return ["members": hex(members.bytes), "body": hex(Array(members.bytes.dropLast(64))), "signerKey": hex(Fixed.keyA.publicKey.x963),
                "relayKey": hex(Fixed.keyRelay.publicKey.x963), "memberKey": hex(Fixed.keyB.publicKey.x963), "sequence": "1700000000000"]
    }

    /// Relay session frames (§20.4), each as it goes on the wire.
    func relayMessages(_ blob: SealedBlob, _ envelope: KeyEnvelope) -> [JSON] {
        let messages: [(String, RelayMessage)] = [
            ("hello without a member list", .hello(group: Fixed.group, members: nil, enrolSecret: nil)),
            ("want", .want([Fixed.a: 4, Fixed.b: 2])),
            ("upload", .upload(blob)),
            ("stored", .stored(replica: Fixed.a, last: 4, snapshot: false)),
            ("caughtUp", .caughtUp(3)),
            ("keys", .keys([envelope])),
            ("notice over the byte quota", .notice(.overBytes, "the group's storage quota is full")),
            ("refused: not a member", .refused(.notMember, "not a member")),
            ("ping", .ping(7)),
        ]
        return messages.map { name, message in ["name": name, "frame": hex(message.frame)] }
    }

    // MARK: seen (compaction gossip, PROTOCOL §19)

    /// The roster the seen vectors are checked against: A creates the group and claims replica
    /// a; A adds B, which claims b. Stored entries are kept while they decode (their signatures
    /// are randomized; the group ID is the genesis entry's ID).
    func seenRoster() -> [RosterEntry] {
        if let stored = existing["seen.json"]?["roster"] as? [String],
           let entries = try? stored.map({ try RosterEntry(bytes: unhex($0)) }), entries.count == 4 {
            return entries
        }
        let genesis = try! RosterEntry.genesis(groupName: "vectors", creatorName: "A", timestamp: Fixed.ts(1), creator: Fixed.keyA)
        var entries = [genesis]
        func sign(_ payload: RosterPayload, _ key: DeviceKey, _ offset: UInt64) {
            let roster = Roster(groupID: genesis.groupID, entries: entries)
            entries.append(try! RosterEntry.make(payload, context: roster.context(for: key.deviceID, at: Fixed.ts(offset)), signer: key))
        }
        sign(.writer(Fixed.a), Fixed.keyA, 2)
        sign(.add(device: Fixed.keyB.publicKey, name: "B", role: .member), Fixed.keyA, 3)
        sign(.writer(Fixed.b), Fixed.keyB, 4)
        return entries
    }

    func seen() -> JSON {
        let roster = seenRoster()
        let group = roster[0].groupID
        let stored = ((existing["seen.json"]?["reports"] as? [JSON]) ?? [])
        /// A report signed by `key`, naming `device`; the stored one with this name if it still
        /// verifies for the same body.
        func report(_ name: String, by key: DeviceKey, device: DeviceKey? = nil, group: GroupID, replica: ReplicaID, time: UInt64,
                    _ context: CausalContext) -> SeenReport {
            let device = (device ?? key).deviceID.bytes
            let body = SeenReport.body(groupID: group.bytes, device: device, replica: replica, time: time, context: context)
            if let old = stored.first(where: { ($0["name"] as? String) == name }).flatMap({ try? SeenReport(bytes: unhex($0["report"])) }),
               old.body == body, key.publicKey.isValidSignature(old.signature, for: SeenReport.signingDomain + body) {
                return old
            }
            return SeenReport(groupID: group.bytes, device: device, replica: replica, time: time, context: context,
                              signature: key.signature(for: SeenReport.signingDomain + body))
        }
        let seenA = CausalContext(versionVector: [Fixed.a: 4, Fixed.b: 1])
        let valid = report("valid", by: Fixed.keyA, group: group, replica: Fixed.a, time: Fixed.t0 + 1_000, seenA)
        let validB = report("valid, device B", by: Fixed.keyB, group: group, replica: Fixed.b, time: Fixed.t0 + 900,
                            CausalContext(versionVector: [Fixed.a: 2, Fixed.b: 3]))
        let cases: [(String, SeenReport, String)] = [
            ("valid", valid, "valid"),
            ("valid, device B", validB, "valid"),
            ("forged signer: names device A, signed by B's key", report("forged signer: names device A, signed by B's key", by: Fixed.keyB,
                device: Fixed.keyA, group: group, replica: Fixed.a, time: Fixed.t0 + 2_000, seenA), "forged"),
            ("another group", report("another group", by: Fixed.keyA, group: Fixed.group, replica: Fixed.a, time: Fixed.t0 + 2_000, seenA),
             "forged"),
            ("device B reports for replica a, which A claims", report("device B reports for replica a, which A claims", by: Fixed.keyB,
                group: group, replica: Fixed.a, time: Fixed.t0 + 2_000, seenA), "forged"),
            ("replayed older sequence (after valid)", report("replayed older sequence (after valid)", by: Fixed.keyA, group: group,
                replica: Fixed.a, time: Fixed.t0 + 500, CausalContext(versionVector: [Fixed.a: 9])), "older"),
        ]
        let body = SeenMessage.encodedBody([valid, validB])
        let one = valid.bytes
        func entry(_ bytes: [UInt8]) -> [UInt8] { varint(UInt64(bytes.count)) + bytes }
        return [
            "kind": "seen",
            "description": "Signed compaction reports (PROTOCOL §19). report = body ‖ signature; body = 01 ‖ group ID (16) ‖ device ID (20) ‖ replica ID (16) ‖ varint(time) ‖ varint(len) context-blob; signature = ECDSA P-256 SHA-256, low-S, by the device's key over \"peersync seen report v1\" 00 ‖ body. The roster (entries in hex, in order: genesis by A, A's writer claim on replica a, A adds B, B's claim on b) decides: a report counts if its group is the roster's, the key of the device it names verifies the signature, and that device claims the replica; else it is forged (the session closes with reason 15). 'older': a report with an earlier time than the one held for its replica (here: after 'valid') changes nothing. ECDSA is randomized: check that signatures verify, not that you produce the same bytes. seen message body = 02 ‖ varint(n) ‖ n × (varint(len) report), replica IDs strictly ascending; invalid bodies close the session with reason 5.",
            "roster": roster.map { hex($0.bytes) },
            "reports": cases.map { name, report, verdict -> JSON in
                ["name": name, "verdict": verdict, "device": hex(report.device), "groupID": hex(report.groupID), "replica": replicaHex(report.replica),
                 "time": Int(report.time), "context": contextJSON(report.context), "body": hex(report.body), "report": hex(report.bytes)]
            },
            "message": ["reports": ["valid", "valid, device B"], "body": hex(body), "frame": hex(SeenMessage.encodedFrame([valid, validB]))] as JSON,
            "invalid": [
                ["name": "empty body", "hex": ""],
                ["name": "format 01 (unsigned reports of the previous version)", "hex": hex([1, 0, 0])],
                ["name": "replica IDs not ascending", "hex": hex([2, 2] + entry(validB.bytes) + entry(one))],
                ["name": "the same replica twice", "hex": hex([2, 2] + entry(one) + entry(one))],
                ["name": "10,001 reports announced", "hex": hex([2] + varint(10_001))],
                ["name": "a report cut short", "hex": hex([2, 1] + entry(Array(one.dropLast())))],
                ["name": "a trailing byte", "hex": hex(body + [0])],
            ] as [JSON],
        ]
    }

    // MARK: varint

    func varints() -> JSON {
        let values: [UInt64] = [0, 1, 127, 128, 300, 16_383, 16_384, 4_194_304, 1 << 53, UInt64(Int64.max), .max]
        let signed: [Int64] = [0, -1, 1, -2, 63, -64, 64, 1_000_000, -1_000_000, .max, .min]
        return [
            "kind": "varint",
            "description": "LEB128 varints (unsigned) and zigzag varints (signed 64-bit).",
            "varints": values.map { v -> JSON in
                var out: [UInt8] = []
                Varint.append(v, to: &out)
                return ["value": String(v), "hex": hex(out)]
            },
            "zigzag": signed.map { v -> JSON in
                var out: [UInt8] = []
                WireDelta.appendZigzag(v, to: &out)
                return ["value": String(v), "hex": hex(out)]
            },
            "invalid": [
                ["hex": "80", "why": "truncated: the last byte has its high bit set"],
                ["hex": "ffffffffffffffffff02", "why": "10th byte above 1 (more than 64 bits)"],
                ["hex": "8080808080808080808001", "why": "longer than 10 bytes"],
            ],
        ]
    }

    // MARK: frames

    func frames() -> JSON {
        let bodies: [(String, UInt8, [UInt8])] = [
            ("ping, nonce 7", 6, [0x08, 0x07]),
            ("a frame whose length takes two bytes (type 3 and 199 body bytes)", 3, [1] + [UInt8](repeating: 0xab, count: 198)),
            ("type only, empty body (a pong without fields)", 7, []),
        ]
        return [
            "kind": "frames",
            "description": "frame = varint(length of type + body) u8(type) body. Invalid headers close the session with the given reason.",
            "valid": bodies.map { name, type, body -> JSON in
                ["name": name, "type": Int(type), "body": hex(body), "frame": hex(Frame.encode(type: type, body: body))]
            },
            "invalid": [
                ["name": "length 0", "hex": "00", "maxFrameBytes": 4_194_304, "error": "emptyFrame", "reason": 5],
                ["name": "length over the receiver's limit (65,537 > 65,536)", "hex": "818004", "maxFrameBytes": 65_536,
                 "error": "frameTooLarge", "reason": 6],
                ["name": "refused before the varint ends: 4 bytes already exceed 4 MiB", "hex": "ffffffff",
                 "maxFrameBytes": 4_194_304, "error": "frameTooLarge", "reason": 6],
                ["name": "length varint longer than 5 bytes", "hex": "8080808080", "maxFrameBytes": 4_194_304,
                 "error": "malformedLength", "reason": 5],
            ] as [JSON],
        ]
    }

    // MARK: values

    func values() -> JSON {
        func nested(_ depth: Int) -> FieldValue {
            var value = FieldValue.list([])
            for _ in 0..<depth { value = .list([value]) }
            return value
        }
        let samples: [(String, FieldValue)] = [
            ("null", .null), ("false", .bool(false)), ("true", .bool(true)), ("int 0", .int(0)), ("int -1", .int(-1)),
            ("int 150", .int(150)), ("int min", .int(.min)), ("double 28800 (8 h in seconds)", .double(28_800)),
            ("double -0.5", .double(-0.5)), ("string", .string("Depot Nord ü")), ("empty string", .string("")),
            ("bytes", .bytes([0, 1, 0xfe, 0xff])), ("list", .list([.int(1), .string("a"), .null])),
            ("map: keys sorted bytewise (\"B\" < \"a\" < \"ab\")", .map(["a": .int(1), "ab": .bool(true), "B": .null])),
            ("uuid", .uuid(Fixed.r1)),
            ("attachment reference (a map)", .map(["sha256": .bytes([UInt8](repeating: 0x11, count: 32)), "size": .int(1234),
                                                  "type": .string("image/png")])),
            ("64 nested lists: the innermost is at depth 63, the deepest allowed", nested(63)),
        ]
        return [
            "kind": "values",
            "description": "Canonical field value encoding. Depth: the top value is at depth 0, the items of a list or map one deeper; a value at depth 64 is malformed.",
            "valid": samples.map { name, value -> JSON in ["name": name, "value": valueJSON(value), "hex": hex(value.encoded)] },
            "invalid": [
                ["name": "65 nested lists (innermost at depth 64)", "hex": String(repeating: "0701", count: 64) + "0700", "error": "tooDeep"],
                ["name": "map with a key twice", "hex": "0802" + "016100" + "016101", "error": "duplicateKey"],
                ["name": "unknown tag 0x0a", "hex": "0a", "error": "unknownTag"],
                ["name": "string that is not UTF-8", "hex": "0501ff", "error": "invalidUTF8"],
                ["name": "list count beyond the bytes left", "hex": "070500", "error": "truncated"],
                ["name": "double with 7 bytes", "hex": "04000000000000f0", "error": "truncated"],
            ],
        ]
    }

    // MARK: hlc

    func hlc() -> JSON {
        let samples: [(UInt64, UInt16)] = [(0, 0), (0, 1), (1, 2), (Fixed.t0, 0), (Fixed.t0, 65_535),
                                            (ValidationLimits.maxPhysicalMilliseconds, 65_535)]
        return [
            "kind": "hlc",
            "description": "HLC timestamps: raw = physical_ms << 16 | logical (u64); the last sample is the largest valid timestamp (9999-12-31T23:59:59.999Z).",
            "valid": samples.map { p, l -> JSON in
                let t = HLCTimestamp(physicalMilliseconds: p, logical: l)
                return ["physical": num(p), "logical": Int(l), "raw": String(t.rawValue), "rawHex": String(format: "%016llx", t.rawValue)]
            },
        ]
    }

    // MARK: context blobs

    func contextBlobs() -> JSON {
        var cloudy = CausalContext(versionVector: [Fixed.a: 3, Fixed.b: 1])
        cloudy.insert(Dot(replica: Fixed.b, counter: 4))
        cloudy.insert(Dot(replica: Fixed.b, counter: 9))
        cloudy.insert(Dot(replica: Fixed.c, counter: 2))
        let samples: [(String, CausalContext)] = [
            ("empty", CausalContext()),
            ("one replica, 1…5", CausalContext(versionVector: [Fixed.a: 5])),
            ("contiguous and cloud counters; a replica with only a cloud (contiguous 0)", cloudy),
            ("counter 2^53, the largest", CausalContext(versionVector: [Fixed.b: ValidationLimits.maxCounter])),
        ]
        let a = Fixed.a.bigEndianBytes, b = Fixed.b.bigEndianBytes
        return [
            "kind": "context-blobs",
            "description": "context-blob = varint(#ids) bytes16(id)… varint(#replicas) (varint(index) varint(contiguous) varint(#cloud) varint(gap)…)…; replicas in ascending ID order.",
            "valid": samples.map { name, context -> JSON in ["name": name, "context": contextJSON(context), "hex": hex(context.encodedBlob())] },
            "decodeOnly": [
                ["name": "a cloud counter that continues contiguous joins it (1…2 and cloud {3, 5} is 1…3 and {5})",
                 "hex": hex([1] + a + [1, 0, 2, 2, 1, 2]),
                 "context": contextJSON(try! CausalContext(blob: [1] + a + [1, 0, 2, 2, 1, 2]))],
            ] as [JSON],
            "invalid": [
                ["name": "cloud gap 0", "hex": hex([1] + a + [1, 0, 1, 1, 0])],
                ["name": "the same ID twice in the table", "hex": hex([2] + a + a + [0])],
                ["name": "the same replica twice in the entries", "hex": hex([1] + a + [2, 0, 1, 0, 0, 2, 0])],
                ["name": "contiguous above 2^53", "hex": hex([UInt8(1)] + b + [1, 0] + varint((1 << 53) + 1) + [0])],
                ["name": "cloud counter above 2^53", "hex": hex([UInt8(1)] + b + [1, 0] + varint(1 << 53) + [1, 1])],
                ["name": "index outside the table", "hex": hex([1] + a + [1, 1, 1, 0])],
                ["name": "table count beyond the bytes", "hex": hex([2] + a + [0])],
                ["name": "a table of 10,001 IDs (refused after reading the count: bounded by 10,000 and by the bytes left)", "hex": "914e"],
                ["name": "trailing byte", "hex": hex([1] + a + [1, 0, 1, 0, 0])],
            ],
        ]
    }

    // MARK: deltas

    /// The states of the delta sequence (one direction of a session, dictionary starting at t0).
    static func deltaSequence() -> [(String, RecordMap)] {
        let a = Fixed.a, b = Fixed.b, c = Fixed.c
        func key(_ collection: String, _ id: UUID) -> RecordKey { RecordKey(collection: collection, id: id) }
        func event(_ writer: ReplicaID, _ counter: UInt64, _ key: RecordKey, _ fields: [String: (FieldValue, HLCTimestamp, HLCTimestamp)]) -> RecordMap {
            let dot = Dot(replica: writer, counter: counter)
            let state = RecordState(fields: SortedMap(fields.mapValues { FieldRegister(value: $0.0, timestamp: $0.1, dot: dot, supersedes: $0.2) }),
                                    presence: [writer: PresenceEntry(counter: counter, removedBy: nil)])
            return RecordMap(records: [(key, state)], context: CausalContext(dots: [dot]), maintainingDigest: false)
        }
        let loc = key("locations", Fixed.r1)
        let first = event(a, 1, loc, ["name": ("Depot", Fixed.ts(5), .zero), "address": ("1 Main St", Fixed.ts(5), .zero)])
        let second = event(a, 2, loc, ["name": ("Depot North", Fixed.ts(9, 1), Fixed.ts(5))])
        // A catch-up style general-form delta: three records, a context with a cloud.
        var general = first
        general.merge(second)
        let shift = RecordState(
            fields: (["symbol": "N", "title": "Night", "description": "", "duration": .double(28_800), "locationID": .uuid(Fixed.r1)]
                     as SortedMap<String, FieldValue>).mapValues { FieldRegister(value: $0, timestamp: Fixed.ts(20), dot: Dot(replica: b, counter: 1), supersedes: .zero) },
            presence: [b: PresenceEntry(counter: 1, removedBy: nil)])
        let deleted = RecordState(presence: [c: PresenceEntry(counter: 3, removedBy: Dot(replica: a, counter: 3))])
        var context = CausalContext(versionVector: [a: 3, b: 1])
        context.insert(Dot(replica: c, counter: 3))
        general = RecordMap(records: general.allRecords + [(key("shiftTypes", Fixed.r2), shift), (key("locations", Fixed.r3), deleted)],
                            context: context, maintainingDigest: false)
        let third = event(a, 4, loc, ["address": ("2 Main St", Fixed.ts(30), Fixed.ts(5))])
        return [
            ("a replica's first write (counter 1): this implementation sends it in the general form, because its context is the vector entry 1…1, not a single cloud dot; defines replica A and the names locations, address, name", first),
            ("event form: the next write by the same replica (references only; supersedes; its timestamp is relative to the dictionary start, as the general form before it did not move it)", second),
            ("general form: three records, a base, a field with its own timestamp and dot, implied presence, a record with only a removed presence entry, a context with a cloud",
             general),
            ("event form after a general-form delta: its timestamp difference is from the last event-form timestamp (t0+9), not from any general-form timestamp",
             third),
        ]
    }

    /// The sequence and two more events, for a peer that reads event counters relative to the
    /// writer's previous event (form 02).
    static func eventCounterSequence() -> [(String, RecordMap)] {
        var sequence = deltaSequence()
        let loc = RecordKey(collection: "locations", id: Fixed.r1)
        func event(_ writer: ReplicaID, _ counter: UInt64, _ field: String, _ value: FieldValue, _ time: HLCTimestamp) -> RecordMap {
            let dot = Dot(replica: writer, counter: counter)
            let state = RecordState(fields: [field: FieldRegister(value: value, timestamp: time, dot: dot, supersedes: Fixed.ts(5))],
                                    presence: [writer: PresenceEntry(counter: counter, removedBy: nil)])
            return RecordMap(records: [(loc, state)], context: CausalContext(dots: [dot]), maintainingDigest: false)
        }
        sequence[1].0 = "form 02: A's event 2 after its general-form write 1: no event of A yet in this direction, so the distance is from 0 (2 − 0 − 1 = 1)"
        sequence[3].0 = "form 02 after a general-form delta: A's event 4 is 1 past its previous event (2); a general-form delta does not move `last`"
        sequence.append(("form 02: A's event 5, right after event 4: distance 0", event(Fixed.a, 5, "name", "Depot East", Fixed.ts(31))))
        sequence.append(("form 02 by another replica: B's first event in this direction, counter 7, defines B: distance 6",
                         event(Fixed.b, 7, "name", "Depot West", Fixed.ts(32))))
        return sequence
    }

    static func form(_ bytes: [UInt8]) -> String { ["general", "event", "event-next"][Int(bytes[0])] }

    func deltas() -> JSON {
        func encoded(_ deltas: [(String, RecordMap)], relativeEventCounters: Bool) -> [JSON] {
            let dictionary = WireDictionary(startingAt: Fixed.t0)
            dictionary.relativeEventCounters = relativeEventCounters
            return deltas.map { name, map -> JSON in
                let bytes = WireDelta.encode(map, with: dictionary)
                return ["name": name, "form": Self.form(bytes), "delta": stateJSON(map), "hex": hex(bytes)]
            }
        }
        let sequence = encoded(Self.deltaSequence(), relativeEventCounters: false)
        let eventCounters = encoded(Self.eventCounterSequence(), relativeEventCounters: true)
        // Decode-only: a record without a base whose field has its own timestamp and dot: the
        // timestamp is relative to the previous record's base, here none, so to t0 << 16.
        var noBase: [UInt8] = [0, 0, 1, 0, 5] + Array("notes".utf8) + [1]
        noBase += Fixed.r1.uuidBytes + [0, 1, 0, 1] + Array("t".utf8) + FieldValue.string("x").encoded + [3]
        let rawDifference: Int64 = 7 << 16 | 2  // t0 + 7 ms, logical 2
        WireDelta.appendZigzag(rawDifference, to: &noBase)
        noBase += [0] + Fixed.a.bigEndianBytes + [1] + [1, 1, 1, 0]
        let decodedNoBase = try! WireDelta.decode(noBase, with: WireDictionary(startingAt: Fixed.t0))
        let empty = WireDelta.encode(RecordMap.empty(), with: WireDictionary(startingAt: Fixed.t0))
        return [
            "kind": "deltas",
            "description": "Deltas of one direction of a session, encoded in order with one dictionary (replicas, names, running timestamp) that starts empty with last_physical = dictionaryStart (the sender's hello wallClock).",
            "dictionaryStart": num(Fixed.t0),
            "sequence": sequence,
            "sequenceEventCounters": eventCounters,
            "sequenceEventCountersDescription": "The same deltas and two more, encoded for a peer whose hello announced feature bit 3 (eventCounters): event-form deltas go in form 02, their counter as the distance from the writer's previous event in this direction. Decoded with one fresh dictionary starting at dictionaryStart.",
            "decodeOnly": [
                ["name": "general form, a record without a base holding a field with its own timestamp (relative to t0 << 16: no earlier base in this delta) and its own dot",
                 "dictionaryStart": num(Fixed.t0), "hex": hex(noBase), "delta": stateJSON(decodedNoBase)],
                ["name": "empty general-form delta (an empty catch-up chunk that is not the last)", "dictionaryStart": num(Fixed.t0),
                 "hex": hex(empty), "delta": stateJSON(RecordMap.empty())],
            ] as [JSON],
            "invalid": invalidDeltas(),
        ]
    }

    func invalidDeltas() -> [JSON] {
        let a = Fixed.a.bigEndianBytes
        let uuid = Fixed.r1.uuidBytes
        // general form, no context, one collection "c" with one record.
        func record(_ body: [UInt8]) -> String { hex([0, 0, 1, 0, 1, 0x63, 1] + uuid + body) }
        let base: [UInt8] = [1, 0] + [0] + a + [2]  // flags 1, time diff 0, define A, counter +1
        return [
            ["name": "unknown form 3", "hex": "03"],
            ["name": "form 02: counter past 2^53 (no earlier event of A: 1 + distance 2^53)",
             "hex": hex([2, 0] + a + varint(ValidationLimits.maxCounter))],
            ["name": "empty delta", "hex": ""],
            ["name": "record flags 4", "hex": record([4, 0, 0])],
            ["name": "implied presence (flag 2) without a base", "hex": record([2, 0])],
            ["name": "field without timestamp or dot (no base, kind 0)", "hex": record([0, 1, 0, 1, 0x66, 0, 0, 0])],
            ["name": "field kind 8", "hex": record(base + [1, 0, 1, 0x66, 0, 8, 0])],
            ["name": "base counter 0", "hex": record([1, 0, 0] + a + [0, 1, 0, 1, 0x66, 0, 0, 0])],
            ["name": "record with no fields and no presence", "hex": record([0, 0, 0])],
            ["name": "replica reference 2 when no replica is defined", "hex": record([1, 0, 2, 2, 0])],
            ["name": "name defined twice", "hex": hex([0, 0, 1, 0, 1, 0x63, 1] + uuid + base + [1, 0, 1, 0x63, 0, 0, 0])],
            ["name": "supersedes not older than the field (same physical, logical 0 vs 0)",
             "hex": record(base + [1, 0, 1, 0x66, 0, 4, 1, 0])],
            ["name": "event form: counter 0", "hex": hex([1, 0] + a + [0])],
            ["name": "event form: timestamp after the year 9999",
             "hex": hex([1, 0] + a + [1, 0, 1, 0x63] + uuid + [1, 0, 1, 0x66, 0] + varint(UInt64(253_402_300_799_999 - Fixed.t0 + 1) << 1) + [0, 0])],
            ["name": "trailing byte after an event", "hex": hex([1, 0] + a + [1, 0, 1, 0x63] + uuid + [0, 0])],
        ]
    }

    // MARK: messages

    static func hello(from replica: ReplicaID = Fixed.a, version: UInt64 = WireLimits.protocolVersion, wallClock: UInt64 = Fixed.t0,
                      maxFrame: UInt64 = 4_194_304, nonce: [UInt8]? = Fixed.nonceA) -> Hello {
        Hello(protocolVersion: version, replicaID: replica, name: "laptop", wallClockMilliseconds: wallClock,
              context: CausalContext(versionVector: [Fixed.a: 4, Fixed.b: 1]), maxFrameBytes: maxFrame,
              digest: StateDigest(high: 0x0123_4567_89ab_cdef, low: 0xfedc_ba98_7654_3210), groupID: Fixed.group.bytes,
              deviceKey: Fixed.keyA.publicKey.x963, nonce: nonce)
    }

    func messages() -> JSON {
        let chunkDelta = WireDelta.encode(records: [(RecordKey, RecordState)](), context: CausalContext(versionVector: [Fixed.a: 4]),
                                          with: WireDictionary(startingAt: Fixed.t0))
        let firstEvent = WireDelta.encode(Self.deltaSequence()[0].1, with: WireDictionary(startingAt: Fixed.t0))
        var breakdown = DigestBreakdown()
        breakdown.collections["locations"] = StateDigest(high: 1, low: 2)
        breakdown.writers[Fixed.a] = StateDigest(high: 3, low: 4)
        let entry = Array(repeating: UInt8(0x5a), count: 8)
        let (supporting1, supporting2) = (Array(repeating: UInt8(0x5b), count: 4), Array(repeating: UInt8(0x5c), count: 4))
        let samples: [(String, Message, JSON)] = [
            ("hello", .hello(Self.hello()), [
                "protocolVersion": 2, "replicaID": replicaHex(Fixed.a), "name": "laptop", "wallClock": num(Fixed.t0),
                "context": contextJSON(Self.hello().context), "maxFrameBytes": 4_194_304, "digest": "0123456789abcdeffedcba9876543210",
                "groupID": hex(Fixed.group.bytes), "deviceKey": hex(Fixed.keyA.publicKey.x963), "nonce": hex(Fixed.nonceA)]),
            ("chunk: the only chunk of a round with nothing to send (no records, carries the context)",
             .chunk(index: 0, count: 1, records: 0, delta: chunkDelta),
             ["index": 0, "count": 1, "records": 0, "delta": hex(chunkDelta)]),
            ("delta: the body is the delta itself (here the first delta of deltas.json)", .delta(firstEvent), ["delta": hex(firstEvent)]),
            ("ack without neighbours", .ack(CausalContext(versionVector: [Fixed.a: 4]), neighbors: nil),
             ["context": contextJSON(CausalContext(versionVector: [Fixed.a: 4]))]),
            ("ack with neighbours", .ack(CausalContext(versionVector: [Fixed.a: 4]), neighbors: [Fixed.b, Fixed.c]),
             ["context": contextJSON(CausalContext(versionVector: [Fixed.a: 4])), "neighbors": [replicaHex(Fixed.b), replicaHex(Fixed.c)]]),
            ("ack with an empty neighbour list (field 2 present, 0 bytes)", .ack(CausalContext(), neighbors: []),
             ["context": [:] as JSON, "neighbors": [] as [Any]]),
            ("digest", .digest(StateDigest(high: 0x0123_4567_89ab_cdef, low: 0xfedc_ba98_7654_3210), records: 42),
             ["digest": "0123456789abcdeffedcba9876543210", "records": 42]),
            ("ping", .ping(1), ["nonce": 1]),
            ("pong", .pong(1), ["nonce": 1]),
            ("goodbye", .goodbye(.shuttingDown, "node shutting down"), ["reason": 7, "text": "node shutting down"]),
            ("error", .error(.clockSkew, "too far"), ["reason": 2, "text": "too far"]),
            ("auth (signature bytes here are placeholders; see auth.json)", .auth(signature: Array(0..<64)), ["signature": hex(Array(0..<64))]),
            ("breakdown", .breakdown(StateDigest(high: 5, low: 6), breakdown),
             ["digest": "00000000000000050000000000000006", "collections": ["locations": "00000000000000010000000000000002"],
              "writers": [replicaHex(Fixed.a): "00000000000000030000000000000004"]]),
            ("join (the entry bytes here are placeholders: a receiver decodes them as a roster entry)", .join(entries: [entry]),
             ["entry": hex(entry)]),
            ("join with a proof of admission: field 1 the admitting entry, field 2 repeated for the entries authorising it (placeholders)",
             .join(entries: [entry, supporting1, supporting2]), ["entry": hex(entry), "supporting": [hex(supporting1), hex(supporting2)]]),
        ]
        return [
            "kind": "messages",
            "description": "One frame per message, as this implementation writes it (fields in ascending order). A reader must also accept fields in any order, unknown fields, and repeated fields (last wins).",
            "valid": samples.map { name, message, fields -> JSON in
                ["name": name, "type": Int(message.kind.rawValue), "fields": fields, "frame": hex(message.encodedFrame())]
            },
            "decodeOnly": decodeOnlyMessages(),
            "receiver": [
                "description": "The session every invalid frame is fed to: replica B at wall clock t0, never admitted (it receives no auth). Its hello would announce features 12 = bit 2 (deflated chunks) + bit 3 (event counters): it reads delta forms 01 and 02 and deflated chunks, and refuses types 13-15 (attachments) and 16 (seen) as unknown (reason 10). A frame is decoded and checked (fields, chunk order, the delta and its bounds, the skew of its timestamps) before admission is asked, so a frame that fails those gets reason 5, not 12 (PROTOCOL 6.1).",
                "replica": replicaHex(Fixed.b), "wallClock": num(Fixed.t0), "features": 12, "admitted": false,
            ] as JSON,
            "invalid": invalidMessages(),
        ]
    }

    func decodeOnlyMessages() -> [JSON] {
        // ping with an unknown field 15 (wire type 1, 8 bytes) and field 1 twice: nonce 9 wins.
        let ping: [UInt8] = [0x79] + [UInt8](repeating: 0xee, count: 8) + [0x08, 0x05, 0x08, 0x09]
        // goodbye with an unknown reason code 77 reads as reason 99 (other).
        let goodbye: [UInt8] = [0x08, 77]
        let (plainChunk, deflatedChunk) = Self.deflatedChunk(existing: existing["messages.json"])
        return [
            ["name": Self.deflatedChunkName, "frame": hex(deflatedChunk), "equals": hex(plainChunk.encodedFrame())],
            ["name": "ping: unknown field 15 (wire type 1) skipped; field 1 twice, the last wins", "frame": hex(Frame.encode(type: 6, body: ping)),
             "equals": hex(Message.ping(9).encodedFrame())],
            ["name": "goodbye with an unknown reason 77 and no text: read as reason 99, text empty", "frame": hex(Frame.encode(type: 8, body: goodbye)),
             "equals": hex(Message.goodbye(.other, "").encodedFrame())],
            ["name": "ping without fields: nonce 0", "frame": hex(Frame.encode(type: 6, body: [])), "equals": hex(Message.ping(0).encodedFrame())],
        ]
    }

    static let deflatedChunkName = "chunk whose delta is deflated (field 5 = its inflated length; 16 records): reads as the plain chunk"

    /// A chunk of 16 records and its frame with the delta deflated. zlib's output may differ
    /// between versions; a stored frame that still inflates to this chunk is kept.
    static func deflatedChunk(existing: JSON?) -> (Message, [UInt8]) {
        var records = RecordMap()
        for i in 0..<16 {
            let id = UUID(uuidString: String(format: "20000000-0000-4000-8000-%012d", i))!
            _ = try! records.write(["title": .string("Night shift \(i)"), "duration": .int(28_800),
                                    "description": .string("Covers ward \(i % 4) with handover at the start.")],
                                   to: RecordKey(collection: "shiftTypes", id: id), at: Fixed.ts(UInt64(i)), by: Fixed.a)
        }
        let delta = WireDelta.encode(records, with: WireDictionary(startingAt: Fixed.t0))
        let chunk = Message.chunk(index: 0, count: 1, records: 16, delta: delta)
        let stored = (existing?["decodeOnly"] as? [JSON])?.first { $0["name"] as? String == deflatedChunkName }
        if let text = stored?["frame"] as? String {
            var splitter = FrameSplitter()
            splitter.append(unhex(text))
            if let frame = try? splitter.next(), (try? Message.decode(type: frame.type, body: frame.body)) == chunk {
                return (chunk, unhex(text))
            }
        }
        return (chunk, chunk.encodedFrame(deflatingChunk: true))
    }

    /// `body`'s fields in order, each replaced by what `change` returns for (number, varint
    /// value if wire type 0, the field's bytes as written).
    static func rewritingFields(of body: [UInt8], _ change: (UInt64, UInt64?, ArraySlice<UInt8>) -> [UInt8]) -> [UInt8] {
        var reader = ByteReader(body)
        var out: [UInt8] = []
        while !reader.isAtEnd {
            let start = reader.offset
            let key = reader.readVarint()!
            let value = key & 7 == 0 ? reader.readVarint() : { _ = reader.readLengthPrefixed(); return nil }()
            out += change(key >> 3, value, body[start..<reader.offset])
        }
        return out
    }

    /// A deflated chunk frame with its field 5 (the declared inflated length) one larger.
    static func inflatedLengthOneMore(_ frame: [UInt8]) -> [UInt8] {
        var splitter = FrameSplitter()
        splitter.append(frame)
        let (type, body) = try! splitter.next()!
        return Frame.encode(type: type, body: rewritingFields(of: body) { number, value, raw in
            guard number == 5, let value else { return Array(raw) }
            var field = FieldWriter()
            field.varint(5, value + 1)
            return field.bytes
        })
    }

    func invalidMessages() -> [JSON] {
        func frame(_ type: UInt8, _ body: [UInt8]) -> String { hex(Frame.encode(type: type, body: body)) }
        func helloFrame(_ hello: Hello) -> String { hex(Message.hello(hello).encodedFrame()) }
        func without(_ field: UInt8) -> String {
            // Re-encodes the vector hello without one field.
            frame(1, Self.rewritingFields(of: Message.hello(Self.hello()).body()) { number, _, raw in number == field ? [] : Array(raw) })
        }
        let ahead = Self.deltaSequence()[0].1
        var farDelta = RecordMap.empty()
        for (key, state) in ahead.allRecords {
            let moved = RecordState(fields: state.fields.mapValues {
                FieldRegister(value: $0.value, timestamp: HLCTimestamp(physicalMilliseconds: Fixed.t0 + 300_001, logical: 0), dot: $0.dot,
                              supersedes: .zero)
            }, presence: state.presence)
            farDelta = RecordMap(records: [(key, moved)], context: ahead.context, maintainingDigest: false)
        }
        let far = WireDelta.encode(farDelta, with: WireDictionary(startingAt: Fixed.t0))
        let tooDeep = String(repeating: "0701", count: 64) + "0700"
        var deepEvent: [UInt8] = [1, 0] + Fixed.a.bigEndianBytes + [1, 0, 1, 0x63] + Fixed.r1.uuidBytes + [1, 0, 1, 0x66]
        deepEvent += unhex(tooDeep) + [0x0e, 0, 0]
        return [
            ["name": "hello of protocol version 1", "after": "nothing", "frame": helloFrame(Self.hello(version: 1)), "reason": 1],
            ["name": "hello from the receiver's own replica ID", "after": "nothing", "frame": helloFrame(Self.hello(from: Fixed.b)), "reason": 3],
            ["name": "hello with a wall clock 300.001 s ahead", "after": "nothing", "frame": helloFrame(Self.hello(wallClock: Fixed.t0 + 300_001)),
             "reason": 2],
            ["name": "hello announcing maxFrameBytes 65,535", "after": "nothing", "frame": helloFrame(Self.hello(maxFrame: 65_535)), "reason": 5],
            ["name": "hello without a nonce (field 10)", "after": "nothing", "frame": without(10), "reason": 5],
            ["name": "hello without a group ID (field 8)", "after": "nothing", "frame": without(8), "reason": 5],
            ["name": "hello without a device key (field 9)", "after": "nothing", "frame": without(9), "reason": 5],
            ["name": "hello without a name (field 3)", "after": "nothing", "frame": without(3), "reason": 5],
            ["name": "hello without a context (field 5)", "after": "nothing", "frame": without(5), "reason": 5],
            ["name": "hello with a nonce of 15 bytes", "after": "nothing",
             "frame": helloFrame(Self.hello(nonce: Array(Fixed.nonceA.prefix(15)))), "reason": 5],
            ["name": "a ping before the hello", "after": "nothing", "frame": frame(6, [0x08, 1]), "reason": 5],
            ["name": "a second hello", "after": "hello", "frame": helloFrame(Self.hello()), "reason": 5],
            ["name": "type 0", "after": "hello", "frame": frame(0, []), "reason": 10],
            ["name": "type 13 (attachmentRequest) to a receiver that did not announce attachments (features bit 0)", "after": "hello",
             "frame": frame(13, []), "reason": 10],
            ["name": "type 16 (seen) to a receiver that did not announce signed reports (features bit 4)", "after": "hello",
             "frame": frame(16, [2, 0]), "reason": 10],
            ["name": "type 200", "after": "hello", "frame": frame(200, []), "reason": 10],
            ["name": "field with wire type 3", "after": "hello", "frame": frame(6, [0x0b]), "reason": 5],
            ["name": "truncated field", "after": "hello", "frame": frame(6, [0x08]), "reason": 5],
            ["name": "chunk index 2 of 2", "after": "hello", "frame": frame(2, [0x08, 2, 0x10, 2, 0x18, 0, 0x22, 3, 0, 0, 0]), "reason": 5],
            ["name": "chunk count 2^32 + 1", "after": "hello",
             "frame": frame(2, [0x08, 0, 0x10] + varint((1 << 32) + 1) + [0x18, 0, 0x22, 3, 0, 0, 0]), "reason": 5],
            ["name": "chunk claiming 4 records in a delta of 3 bytes", "after": "hello",
             "frame": frame(2, [0x08, 0, 0x10, 1, 0x18, 4, 0x22, 3, 0, 0, 0]), "reason": 5],
            ["name": "chunk 1 of 2 when chunk 0 was expected", "after": "hello",
             "frame": frame(2, [0x08, 1, 0x10, 2, 0x18, 0, 0x22, 3, 0, 0, 0]), "reason": 5],
            ["name": "chunk without its delta field", "after": "hello", "frame": frame(2, [0x08, 0, 0x10, 1, 0x18, 0]), "reason": 5],
            ["name": "deflated chunk declaring one byte more than its delta inflates to", "after": "hello",
             "frame": hex(Self.inflatedLengthOneMore(Self.deflatedChunk(existing: existing["messages.json"]).1)), "reason": 5],
            ["name": "deflated chunk whose field 4 is not a raw DEFLATE stream", "after": "hello",
             "frame": frame(2, [0x08, 0, 0x10, 1, 0x18, 0, 0x22, 3, 0xff, 0xff, 0xff, 0x28, 3]), "reason": 5],
            ["name": "delta with an empty body", "after": "hello", "frame": frame(3, []), "reason": 5],
            ["name": "delta of form 02 (event-next) that ends after its form byte", "after": "hello", "frame": frame(3, [2]), "reason": 5],
            ["name": "delta of unknown form 3", "after": "hello", "frame": frame(3, [3]), "reason": 5],
            ["name": "delta with a field timestamp 300.001 s ahead of the receiver's clock", "after": "hello", "frame": frame(3, far),
             "reason": 5],
            ["name": "delta with a value nested 65 deep", "after": "hello", "frame": frame(3, deepEvent), "reason": 5],
            ["name": "auth signature of 63 bytes", "after": "hello", "frame": frame(10, [0x0a, 63] + [UInt8](repeating: 1, count: 63)),
             "reason": 5],
            ["name": "ack neighbours of 17 bytes", "after": "hello", "frame": frame(4, [0x0a, 2, 0, 0, 0x12, 17] + [UInt8](repeating: 1, count: 17)),
             "reason": 5],
            ["name": "ack without a context", "after": "hello", "frame": frame(4, []), "reason": 5],
            ["name": "digest of 15 bytes", "after": "hello", "frame": frame(5, [0x0a, 15] + [UInt8](repeating: 1, count: 15)), "reason": 5],
            ["name": "join with 65 entries (field 1 and 64 times field 2; at most 64 in all)", "after": "hello",
             "frame": frame(12, [0x0a, 1, 0] + Array(Array(repeating: [0x12, 1, 0] as [UInt8], count: 64).joined())), "reason": 5],
            ["name": "join with supporting entries but no field 1", "after": "hello", "frame": frame(12, [0x12, 1, 0]), "reason": 5],
        ]
    }

    // MARK: digests

    func digests() -> JSON {
        let hashes: [[UInt8]] = [[], [0], Array(0..<8), Array(0..<15), Array(0..<16)]
        var states: [(String, RecordMap)] = [("empty state", RecordMap())]
        var state = RecordMap()
        let loc = RecordKey(collection: "locations", id: Fixed.r1)
        _ = try! state.write(["name": "Depot", "address": "1 Main St"], to: loc, at: Fixed.ts(5), by: Fixed.a)
        states.append(("one record written once (two fields, one presence entry, context A:1)", state))
        _ = try! state.write(["title": "Night", "duration": .double(28_800)], to: RecordKey(collection: "shiftTypes", id: Fixed.r2),
                             at: Fixed.ts(6), by: Fixed.b)
        _ = try! state.remove(loc, by: Fixed.b)
        _ = try! state.write(["e": .bytes([1, 2, 3])], to: RecordKey(collection: "_roster", id: Fixed.r3), at: Fixed.ts(7), by: Fixed.a)
        _ = try! state.write(["weekStart": .int(1)], to: RecordKey.settingsForVectors, at: Fixed.ts(8), by: Fixed.a)
        states.append(("a deleted record (not in the digest, but counted in records), a _roster record and the settings record: records = 4", state))
        return [
            "kind": "digests",
            "description": "SipHash-2-4-128 with key k0 = 0x5065657253796e63, k1 = 0x2d64696765737431 (lanes: first output word = high), and state digests (sum of the element hashes of visible records and the context, lane-wise mod 2^64; a deleted record adds nothing). records = every record held, visible or not, in every collection.",
            "siphash": hashes.map { input -> JSON in
                var h = StableHasher()
                for byte in input { h.combine(byte) }
                let (high, low) = h.finalize()
                return ["input": hex(input), "high": String(format: "%016llx", high), "low": String(format: "%016llx", low)]
            },
            "states": states.map { name, map -> JSON in
                ["name": name, "state": stateJSON(map), "digest": map.digest.description, "records": map.recordCount]
            },
        ]
    }

    // MARK: identity

    func identity() -> JSON {
        let keys: [(String, DeviceKey)] = [("peersync test vector", Fixed.keyA), ("peersync test vector b", Fixed.keyB)]
        let id = Fixed.keyA.deviceID
        let human = id.humanForm
        let lowered = human.lowercased()
        let folded = human.replacingOccurrences(of: "1", with: "l").replacingOccurrences(of: "0", with: "O")
        return [
            "kind": "identity",
            "description": "Device keys (private scalar = SHA-256 of the label), their uncompressed points, SPKI DER, device IDs (first 20 bytes of SHA-256(SPKI)) and human forms.",
            "devices": keys.map { label, key -> JSON in
                ["label": label, "privateScalar": hex(key.privateKey.rawRepresentation), "publicKey": hex(key.publicKey.x963),
                 "spki": hex(key.privateKey.publicKey.derRepresentation), "deviceID": hex(key.deviceID.bytes),
                 "humanForm": key.deviceID.humanForm, "shortForm": key.deviceID.shortForm]
            },
            "parse": [
                ["text": human, "deviceID": hex(id.bytes)],
                ["text": lowered, "deviceID": hex(id.bytes)],
                ["text": human.replacingOccurrences(of: "-", with: " "), "deviceID": hex(id.bytes)],
                ["text": human.replacingOccurrences(of: "-", with: ""), "deviceID": hex(id.bytes)],
                ["text": folded, "deviceID": hex(id.bytes)],
                ["text": String(human.dropLast()), "error": "wrongLength"],
                ["text": "U" + String(human.dropFirst()), "error": "badCharacter"],
            ],
        ]
    }

    // MARK: invite codes

    func inviteCodes() -> JSON {
        let token = InviteToken(bytes: (0xc0...0xcf).map { UInt8($0) })!
        let code = InviteCode(groupID: Fixed.group, inviter: Fixed.keyA.deviceID, token: token)
        let text = code.text
        let zeroCode = InviteCode(groupID: GroupID(bytes: [UInt8](repeating: 0, count: 16))!,
                                  inviter: DeviceID(bytes: [UInt8](repeating: 0, count: 20))!,
                                  token: InviteToken(bytes: [UInt8](repeating: 0, count: 16))!)
        let maxCode = InviteCode(groupID: GroupID(bytes: [UInt8](repeating: 0xff, count: 16))!,
                                 inviter: DeviceID(bytes: [UInt8](repeating: 0xff, count: 20))!,
                                 token: InviteToken(bytes: [UInt8](repeating: 0xff, count: 16))!)
        func parts(_ c: InviteCode) -> JSON {
            ["groupID": hex(c.groupID.bytes), "inviter": hex(c.inviter.bytes), "token": hex(c.token.bytes), "code": c.text,
             "tokenHash": hex(c.token.hash.bytes)]
        }
        let body = String(text.dropFirst(4))
        var wrongCheck = Array(text)
        let lastIndex = wrongCheck.count - 1
        wrongCheck[lastIndex] = wrongCheck[lastIndex] == "0" ? "1" : "0"
        let secret = GroupSecret(bytes: (0x00..<0x14).map { UInt8($0 * 13 & 0xff) })
        return [
            "kind": "invite-codes",
            "description": "PS2 invite codes (group ID 16 ‖ inviter device ID 20 ‖ token 16, Crockford base32, check character = the 52 bytes mod 37), PSR recovery codes (group ID 16 ‖ recovery key's P-256 private scalar 32, the same encoding; the recovery key's device ID is that of its public key) and the old PS1 group secrets (20 bytes) of protocol 1.",
            "valid": [parts(code), parts(zeroCode), parts(maxCode)],
            "parse": [
                ["text": text, "code": text],
                ["text": text.lowercased(), "code": text],
                ["text": "PS2" + body.replacingOccurrences(of: "-", with: ""), "code": text],
                ["text": "  " + text.replacingOccurrences(of: "-", with: " ") + " ", "code": text],
                ["text": text.replacingOccurrences(of: "1", with: "I").replacingOccurrences(of: "0", with: "o"), "code": text],
                ["text": "PS1-" + body, "error": "oldStyleGroupSecret"],
                ["text": "PSX-" + body, "error": "badPrefix"],
                ["text": String(text.dropLast(2)), "error": "wrongLength"],
                ["text": "PS2-U" + body.dropFirst(1), "error": "badCharacter"],
                ["text": String(wrongCheck), "error": "checkMismatch"],
            ],
            "recoveryCodes": recoveryCodes(),
            "legacyGroupSecrets": [
                ["secret": hex(secret.bytes), "code": secret.inviteCode, "tlsPSK": hex(secret.preSharedKey),
                 "pskIdentity": "peersync/" + secret.groupTag, "legacyTag": secret.groupTag,
                 "legacyKeyPublic": hex(LegacyGroupKey(groupSecret: secret.bytes).publicKey.x963),
                 "upgradedGroupID": hex(LegacyGroupKey(groupSecret: secret.bytes).groupID.bytes)],
            ],
        ]
    }

    /// PSR recovery codes (PROTOCOL §12.3): valid ones with their parts, and texts refused.
    func recoveryCodes() -> JSON {
        let recovery = RecoveryCode(groupID: Fixed.group, key: Fixed.key("peersync recovery vector"))
        let text = recovery.text
        let body = String(text.dropFirst(4))
        var wrongCheck = Array(text)
        wrongCheck[wrongCheck.count - 1] = wrongCheck.last == "0" ? "1" : "0"
        return [
            "valid": [["groupID": hex(recovery.groupID.bytes), "privateKey": hex(Array(recovery.key.privateKey.rawRepresentation)),
                       "recoveryDeviceID": hex(recovery.key.deviceID.bytes), "code": text]],
            "parse": [
                ["text": text.lowercased().replacingOccurrences(of: "-", with: " "), "code": text],
                ["text": "PS2-" + body, "error": "badPrefix"],
                ["text": String(text.dropLast(2)), "error": "wrongLength"],
                ["text": "PSR-U" + body.dropFirst(1), "error": "badCharacter"],
                ["text": String(wrongCheck), "error": "checkMismatch"],
            ],
        ]
    }

    // MARK: auth

    func auth() -> JSON {
        let transcript = SessionAuth.transcript(signerNonce: Fixed.nonceA, verifierNonce: Fixed.nonceB, signer: Fixed.a,
                                                group: Fixed.group.bytes)
        let swapped = SessionAuth.transcript(signerNonce: Fixed.nonceB, verifierNonce: Fixed.nonceA, signer: Fixed.a, group: Fixed.group.bytes)
        let entries = ((existing["auth.json"]?["valid"] as? [JSON]) ?? []) + ((existing["auth.json"]?["invalid"] as? [JSON]) ?? [])
        /// The stored signature of the entry `name` if it still verifies, else a new one.
        func signature(_ name: String, _ key: DeviceKey, _ message: [UInt8]) -> [UInt8] {
            let old = entries.first { ($0["name"] as? String) == name }.map { unhex($0["signature"]) }
            if let old, key.publicKey.isValidSignature(old, for: message) { return old }
            return key.signature(for: message)
        }
        let valid = signature("valid", Fixed.keyA, transcript)
        let highS = Array(valid[0..<32]) + subtract(ECDSALowS.order, Array(valid[32..<64]))
        let input: JSON = ["signerNonce": hex(Fixed.nonceA), "verifierNonce": hex(Fixed.nonceB), "signerReplica": replicaHex(Fixed.a),
                           "groupID": hex(Fixed.group.bytes), "signerKey": hex(Fixed.keyA.publicKey.x963)]
        func with(_ extra: JSON) -> JSON { input.merging(extra) { $1 } }
        let wrongOrder = "signed with the nonces in the wrong order (the verifier's first): \"transcript\" is what was signed"
        let otherKey = "a signature by another key (device B)"
        return [
            "kind": "auth",
            "description": "auth transcript = \"peersync session v2\" 00 ‖ signer's nonce ‖ verifier's nonce ‖ signer's replica ID ‖ group ID; signature = ECDSA P-256 SHA-256 over it, 64 bytes r ‖ s, s ≤ n/2. A receiver builds the transcript from the inputs itself and verifies the signature against signerKey. ECDSA is randomized: check that the signature verifies, not that you produce the same bytes.",
            "valid": [with(["name": "valid", "transcript": hex(transcript), "signature": hex(valid)])],
            "invalid": [
                with(["name": "the valid signature with s replaced by n − s (high S)", "transcript": hex(transcript), "signature": hex(highS)]),
                with(["name": wrongOrder, "transcript": hex(swapped), "signature": hex(signature(wrongOrder, Fixed.keyA, swapped))]),
                with(["name": otherKey, "transcript": hex(transcript), "signature": hex(signature(otherKey, Fixed.keyB, transcript))]),
            ],
        ]
    }

    // MARK: discovery

    func discovery() -> JSON {
        let advertisement = PeerAdvertisement(serviceName: "laptop 01020304", port: 7946, replicaID: Fixed.a, groupTag: Fixed.group.discoveryTag,
                                              protocolVersion: Int(WireLimits.protocolVersion))
        return [
            "kind": "discovery",
            "description": "discovery tag = lowercase hex of the first 8 bytes of SHA-256(\"peersync discovery tag\" 00 ‖ group ID); TXT record = length-prefixed key=value strings v, id, g (RFC 6763 §6).",
            "tags": [Fixed.group, GroupID(bytes: [UInt8](repeating: 0, count: 16))!].map { ["groupID": hex($0.bytes), "tag": $0.discoveryTag] },
            "txt": [["entries": advertisement.txtEntries.map { [$0.key, $0.value] }, "hex": hex(TXTRecord.encode(advertisement.txtEntries)!)]] as [JSON],
        ]
    }

    // MARK: bundles and context files

    func bundles() -> JSON {
        let context = CausalContext(versionVector: [Fixed.a: 4, Fixed.b: 1])
        let oldContextFile = (existing["bundles.json"]?["contextFile"] as? JSON)?["hex"].map(unhex)
        let contextFile: [UInt8]
        if let oldContextFile, let opened = try? SyncBundle.openContext(oldContextFile, groupID: Fixed.group), opened.context == context,
           opened.device == Fixed.keyB.publicKey,
           Array(oldContextFile.dropLast(64)) == Array(SyncBundle.sealContext(context, replica: Fixed.b, groupID: Fixed.group, key: Fixed.keyB).dropLast(64)) {
            contextFile = oldContextFile
        } else {
            contextFile = SyncBundle.sealContext(context, replica: Fixed.b, groupID: Fixed.group, key: Fixed.keyB)
        }
        let delta = Self.deltaSequence()[0].1
        let header = SyncBundle.Header(groupID: Fixed.group, sender: Fixed.keyA.publicKey, senderReplica: Fixed.a, senderName: "laptop",
                                       createdAt: Fixed.t0, records: 1)
        let oldBundle = (existing["bundles.json"]?["bundle"] as? JSON)?["hex"].map(unhex)
        let bundle: [UInt8]
        if let oldBundle, let opened = try? SyncBundle.open(oldBundle, groupID: Fixed.group, me: Fixed.keyB), opened.0 == header,
           opened.1 == delta {
            bundle = oldBundle
        } else {
            bundle = SyncBundle.seal(delta, header: header, senderKey: Fixed.keyA, recipients: [Fixed.keyB.publicKey])
        }
        let otherGroup = hex([UInt8](repeating: 7, count: 16))
        func flipped(_ bytes: [UInt8], at offsetFromEnd: Int) -> String {
            var copy = bytes
            copy[copy.count - offsetFromEnd] ^= 1
            return hex(copy)
        }
        func replaced(_ bytes: [UInt8], at index: Int, with byte: UInt8) -> String {
            var copy = bytes
            copy[index] = byte
            return hex(copy)
        }
        let scalarA = hex(Fixed.keyA.privateKey.rawRepresentation), scalarB = hex(Fixed.keyB.privateKey.rawRepresentation)
        let group = hex(Fixed.group.bytes)
        return [
            "kind": "bundles",
            "description": "A context file of device B (signed; deterministic up to its 64-byte signature) and a sync bundle from device A to device B (randomized: ephemeral key, content key, nonces; decrypt it with device B's key). invalidContextFiles and invalidBundles: the same bytes changed, or opened as another group or by another device, each with the error a reader gives (PROTOCOL 14 gives the order of the checks).",
            "invalidContextFiles": [
                ["name": "magic PSCONTEXT changed to PSCONTEXU", "groupID": group, "hex": replaced(contextFile, at: 8, with: 0x55), "error": "notABundle"],
                ["name": "format byte 3", "groupID": group, "hex": replaced(contextFile, at: 9, with: 3), "error": "unsupportedVersion"],
                ["name": "one byte of the context blob changed (the signature no longer verifies)", "groupID": group,
                 "hex": flipped(contextFile, at: 70), "error": "tampered"],
                ["name": "the signature's last byte changed", "groupID": group, "hex": flipped(contextFile, at: 1), "error": "tampered"],
                ["name": "read by a device of another group (07 07 … 07)", "groupID": otherGroup, "hex": hex(contextFile), "error": "otherGroup"],
            ] as [JSON],
            "invalidBundles": [
                ["name": "magic PSBUNDLE changed to PSBUNDLF", "groupID": group, "recipientPrivateScalar": scalarB,
                 "hex": replaced(bundle, at: 7, with: 0x46), "error": "notABundle"],
                ["name": "format byte 3", "groupID": group, "recipientPrivateScalar": scalarB, "hex": replaced(bundle, at: 8, with: 3),
                 "error": "unsupportedVersion"],
                ["name": "one byte of the payload changed (the signature no longer verifies)", "groupID": group, "recipientPrivateScalar": scalarB,
                 "hex": flipped(bundle, at: 80), "error": "tampered"],
                ["name": "the signature's last byte changed", "groupID": group, "recipientPrivateScalar": scalarB, "hex": flipped(bundle, at: 1),
                 "error": "tampered"],
                ["name": "opened by a device of another group (07 07 … 07)", "groupID": otherGroup, "recipientPrivateScalar": scalarB,
                 "hex": hex(bundle), "error": "otherGroup"],
                ["name": "opened by device A, its sender, which is not among its recipients", "groupID": group, "recipientPrivateScalar": scalarA,
                 "hex": hex(bundle), "error": "notForThisDevice"],
            ] as [JSON],
            "contextFile": ["groupID": hex(Fixed.group.bytes), "replica": replicaHex(Fixed.b), "deviceKey": hex(Fixed.keyB.publicKey.x963),
                            "context": contextJSON(context), "hex": hex(contextFile)] as JSON,
            "bundle": ["groupID": hex(Fixed.group.bytes), "senderKey": hex(Fixed.keyA.publicKey.x963), "senderReplica": replicaHex(Fixed.a),
                       "senderName": "laptop", "createdAt": num(Fixed.t0), "records": 1, "recipientPrivateScalar": hex(Fixed.keyB.privateKey.rawRepresentation),
                       "delta": stateJSON(delta), "hex": hex(bundle)] as JSON,
        ]
    }
}

func varint(_ value: UInt64) -> [UInt8] {
    var out: [UInt8] = []
    Varint.append(value, to: &out)
    return out
}

/// Big-endian `a − b` for 32-byte numbers with a ≥ b.
func subtract(_ a: [UInt8], _ b: [UInt8]) -> [UInt8] {
    var result = [UInt8](repeating: 0, count: 32)
    var borrow = 0
    for i in stride(from: 31, through: 0, by: -1) {
        var digit = Int(a[i]) - Int(b[i]) - borrow
        borrow = digit < 0 ? 1 : 0
        if digit < 0 { digit += 256 }
        result[i] = UInt8(digit)
    }
    return result
}

extension UUID {
    var uuidBytes: [UInt8] { withUnsafeBytes(of: uuid) { Array($0) } }
}

extension RecordKey {
    /// The synced settings record (collection "settings", the all-zero UUID), as PeerSyncModel names it.
    static let settingsForVectors = RecordKey(collection: "settings", id: UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)))
}

