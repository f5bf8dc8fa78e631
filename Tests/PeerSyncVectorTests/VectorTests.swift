import Crypto
import Foundation
@_spi(Engine) import PeerSyncCRDT
@testable import PeerSyncDiscovery
@testable import PeerSyncIdentity
@testable import PeerSyncReplication
@testable import PeerSyncNetwork
@testable import PeerSyncWire
@testable import PeerSyncSeal
import PeerSyncRelay
import Testing

/// Checks every file of docs/vectors against this implementation: the bytes it writes for the
/// vectors' inputs, and what it accepts and refuses (with the documented close reason).
///
/// `PEERSYNC_WRITE_VECTORS=1 swift test --filter VectorTests` rewrites the files from the code
/// (keeping stored signatures and bundles that still verify); review the diff like code.
@Suite("Test vectors (docs/vectors)")
struct VectorTests {
    static let names = ["varint.json", "frames.json", "values.json", "hlc.json", "context-blobs.json", "deltas.json", "messages.json",
                        "digests.json", "identity.json", "invite-codes.json", "auth.json", "discovery.json", "bundles.json",
                        "seen.json", "sealed.json"]

    static func existing() -> [String: JSON] {
        var files: [String: JSON] = [:]
        for name in names { files[name] = VectorFiles.loadIfPresent(name) }
        return files
    }

    @Test("every vector file is exactly what this code writes (PEERSYNC_WRITE_VECTORS=1 rewrites them)")
    func filesAreCurrent() throws {
        let built = VectorBuilder(existing: Self.existing()).build()
        #expect(Set(built.keys) == Set(Self.names))
        if ProcessInfo.processInfo.environment["PEERSYNC_WRITE_VECTORS"] == "1" {
            try FileManager.default.createDirectory(at: VectorFiles.directory, withIntermediateDirectories: true)
            for (name, object) in built {
                try VectorFiles.serialize(object).write(to: VectorFiles.directory.appendingPathComponent(name), atomically: true, encoding: .utf8)
            }
        }
        #expect(Set(try VectorFiles.list()) == Set(Self.names), "docs/vectors holds exactly the known files")
        for (name, object) in built.sorted(by: { $0.key < $1.key }) {
            let onDisk = try String(contentsOf: VectorFiles.directory.appendingPathComponent(name), encoding: .utf8)
            #expect(VectorFiles.serialize(object) == onDisk, "\(name) differs from what the code writes")
        }
    }

    @Test("sealed blobs open with their epoch's key as their writer signed them; tampered ones are refused; the envelope opens with the recipient's key")
    func sealedData() throws {
        let file = try VectorFiles.load("sealed.json")
        let group = GroupID(bytes: unhex(file["groupID"]))!
        let keyInfo = file["dataKey"] as! JSON
        let key = DataKey(epoch: UInt64(keyInfo["epoch"] as! String)!, bytes: unhex(keyInfo["key"]))!
        let writerKey = DevicePublicKey(x963: unhex(file["writerKey"]))!
        for v in file["blobs"] as! [JSON] {
            let blob = try SealedBlob(bytes: unhex(v["blob"]))
            #expect(hex(blob.header) == v["header"] as! String)
            #expect(blob.isSigned(by: writerKey), "\(v["name"]!)")
            #expect(hex(try blob.open(with: key, group: group)) == file["plaintext"] as! String)
        }
        for v in file["refused"] as! [JSON] {
            let expected = v["error"] as! String
            let target = (v["groupID"] as? String).map { GroupID(bytes: unhex($0))! } ?? group
            do {
                let blob = try SealedBlob(bytes: unhex(v["blob"]))
                guard blob.isSigned(by: writerKey) else { throw SealError.badSignature("") }
                _ = try blob.open(with: key, group: target)
                Issue.record("\(v["name"]!) was accepted")
            } catch let error as SealError {
                let kind = switch error {
                case .malformed: "malformed"
                case .badSignature: "badSignature"
                case .cannotOpen: "cannotOpen"
                case .notForThis: "notForThis"
                }
                #expect(kind == expected, "\(v["name"]!)")
            }
        }
        // Member lists (§20.3), relay codes and relay session frames (§20.4).
        let membersInfo = file["members"] as! JSON
        let members = try RelayMembers(bytes: unhex(membersInfo["members"]))
        #expect(members.isSelfSigned && members.groupID == group)
        #expect(members.member(DevicePublicKey(x963: unhex(membersInfo["relayKey"]))!.deviceID)?.role == .relay)
        #expect(members.member(DevicePublicKey(x963: unhex(membersInfo["memberKey"]))!.deviceID)?.role == .member)
        let codeInfo = file["relayCode"] as! JSON
        let code = try RelayCode(parsing: codeInfo["code"] as! String)
        #expect(hex(code.relay.bytes) == codeInfo["relayDeviceID"] as! String && hex(code.secret) == codeInfo["secret"] as! String)
        for v in file["relayMessages"] as! [JSON] {
            let frame = unhex(v["frame"])
            var splitter = FrameSplitter()
            splitter.append(frame)
            let (type, body) = try #require(try splitter.next(), "\(v["name"]!)")
            #expect(try RelayMessage.decode(type: type, body: body).frame == frame, "\(v["name"]!)")
        }
        let envelopeInfo = file["envelope"] as! JSON
        let envelope = try KeyEnvelope(bytes: unhex(envelopeInfo["envelope"]))
        #expect(envelope.isSigned(by: DevicePublicKey(x963: unhex(envelopeInfo["senderKey"]))!))
        let recipient = DeviceKey(privateKey: try P256.Signing.PrivateKey(rawRepresentation: unhex(envelopeInfo["recipientScalar"])))
        #expect(hex(try envelope.open(with: recipient, group: group).bytes) == envelopeInfo["opensTo"] as! String)
    }

    @Test("varints and zigzag varints")
    func varints() throws {
        let file = try VectorFiles.load("varint.json")
        for v in file["varints"] as! [JSON] {
            #expect(hex(varint(UInt64(v["value"] as! String)!)) == v["hex"] as! String)
            var reader = ByteReader(unhex(v["hex"]))
            let read = reader.readVarint()
            #expect(read == UInt64(v["value"] as! String)! && reader.isAtEnd)
        }
        for v in file["zigzag"] as! [JSON] {
            var out: [UInt8] = []
            WireDelta.appendZigzag(Int64(v["value"] as! String)!, to: &out)
            #expect(hex(out) == v["hex"] as! String)
            var reader = ByteReader(unhex(v["hex"]))
            let read = try WireDelta.readZigzag(&reader)
            #expect(read == Int64(v["value"] as! String)! && reader.isAtEnd)
        }
        for v in file["invalid"] as! [JSON] {
            var reader = ByteReader(unhex(v["hex"]))
            let read = reader.readVarint()
            #expect(read == nil, "\(v["why"]!)")
        }
    }

    @Test("frames: encoding, and refused headers with their close reason")
    func frames() throws {
        let file = try VectorFiles.load("frames.json")
        for v in file["valid"] as! [JSON] {
            let frame = unhex(v["frame"])
            #expect(Frame.encode(type: UInt8(u64(v["type"])), body: unhex(v["body"])) == frame)
            var splitter = FrameSplitter()
            splitter.append(frame)
            let next = try splitter.next()
            let read = try #require(next)
            #expect(read.type == UInt8(u64(v["type"])) && read.body == unhex(v["body"]))
        }
        for v in file["invalid"] as! [JSON] {
            var splitter = FrameSplitter(maxFrameBytes: Int(u64(v["maxFrameBytes"])))
            splitter.append(unhex(v["hex"]))
            do throws(WireError) {
                _ = try splitter.next()
                Issue.record("\(v["name"]!) was accepted")
            } catch {
                let (kind, reason): (String, UInt64) = switch error {
                case .frameTooLarge: ("frameTooLarge", CloseReason.frameTooLarge.rawValue)
                case .emptyFrame: ("emptyFrame", CloseReason.malformed.rawValue)
                case .malformedLength: ("malformedLength", CloseReason.malformed.rawValue)
                default: ("\(error)", CloseReason.malformed.rawValue)
                }
                #expect(kind == v["error"] as! String, "\(v["name"]!)")
                #expect(reason == u64(v["reason"]), "\(v["name"]!)")
            }
        }
    }

    @Test("field values: canonical bytes; depth, duplicate keys and bad tags refused")
    func values() throws {
        let file = try VectorFiles.load("values.json")
        for v in file["valid"] as! [JSON] {
            let value = parseValue(v["value"])
            #expect(hex(value.encoded) == v["hex"] as! String, "\(v["name"]!)")
            #expect(try FieldValue(decoding: unhex(v["hex"])) == value, "\(v["name"]!)")
        }
        for v in file["invalid"] as! [JSON] {
            do throws(FieldValueDecodingError) {
                _ = try FieldValue(decoding: unhex(v["hex"]))
                Issue.record("\(v["name"]!) was accepted")
            } catch {
                let kind = switch error {
                case .tooDeep: "tooDeep"
                case .duplicateKey: "duplicateKey"
                case .unknownTag: "unknownTag"
                case .invalidUTF8: "invalidUTF8"
                case .truncated: "truncated"
                case .trailingBytes: "trailingBytes"
                }
                #expect(kind == v["error"] as! String, "\(v["name"]!)")
            }
        }
    }

    @Test("HLC timestamps pack as physical << 16 | logical")
    func hlc() throws {
        for v in try VectorFiles.load("hlc.json")["valid"] as! [JSON] {
            let t = HLCTimestamp(physicalMilliseconds: u64(v["physical"]), logical: UInt16(u64(v["logical"])))
            #expect(t.rawValue == u64(v["raw"]))
            #expect(ValidationLimits.isValidTimestamp(t))
        }
    }

    @Test("context blobs: bytes, canonical decoding, refusals")
    func contextBlobs() throws {
        let file = try VectorFiles.load("context-blobs.json")
        for v in file["valid"] as! [JSON] {
            let context = parseContext(v["context"])
            #expect(hex(context.encodedBlob()) == v["hex"] as! String, "\(v["name"]!)")
            #expect(try CausalContext(blob: unhex(v["hex"])) == context, "\(v["name"]!)")
        }
        for v in file["decodeOnly"] as! [JSON] {
            #expect(try CausalContext(blob: unhex(v["hex"])) == parseContext(v["context"]), "\(v["name"]!)")
        }
        for v in file["invalid"] as! [JSON] {
            #expect(throws: BinaryDecodingError.self, "\(v["name"]!)") { try CausalContext(blob: unhex(v["hex"])) }
        }
    }

    @Test("seen (compaction gossip): signed reports judged against the roster, message bodies, refusals")
    func seen() throws {
        let file = try VectorFiles.load("seen.json")
        let entries = try #require(file["roster"] as? [String]).map { try RosterEntry(bytes: unhex($0)) }
        let roster = Roster(groupID: entries[0].groupID, entries: entries)
        #expect(roster.claimant(of: Fixed.a) == Fixed.keyA.deviceID && roster.claimant(of: Fixed.b) == Fixed.keyB.deviceID)
        var held = SeenReports()
        var byName: [String: SeenReport] = [:]
        for v in file["reports"] as! [JSON] {
            let name = v["name"] as! String
            let report = try SeenReport(bytes: unhex(v["report"]))
            byName[name] = report
            #expect(hex(report.body) == v["body"] as! String, "\(name)")
            #expect(report.replica == replica(v["replica"]) && report.time == u64(v["time"]) && report.context == parseContext(v["context"]))
            #expect(hex(report.device) == v["device"] as! String && hex(report.groupID) == v["groupID"] as! String)
            let verdict = report.verdict(in: roster)
            switch v["verdict"] as! String {
            case "valid":
                #expect(verdict == .valid, "\(name): \(verdict)")
                held.record(report)
            case "forged":
                guard case .forged = verdict else { Issue.record("\(name): \(verdict)"); continue }
            case "older":
                #expect(verdict == .valid, "\(name): its signature is good")
                #expect(held.offer(report) == .older, "\(name)")
            default:
                Issue.record("unknown verdict in \(name)")
            }
        }
        let message = file["message"] as! JSON
        let reports = (message["reports"] as! [String]).map { byName[$0]! }
        #expect(hex(SeenMessage.encodedBody(reports)) == message["body"] as! String)
        #expect(hex(SeenMessage.encodedFrame(reports)) == message["frame"] as! String)
        #expect(try SeenMessage.decode(body: unhex(message["body"])) == reports)
        for v in file["invalid"] as! [JSON] {
            #expect(throws: WireError.self, "\(v["name"]!)") { try SeenMessage.decode(body: unhex(v["hex"])) }
        }
    }

    @Test("deltas: every form in one direction, decode-only forms, refusals")
    func deltas() throws {
        let file = try VectorFiles.load("deltas.json")
        let start = u64(file["dictionaryStart"])
        // In order, each sequence with one writer and one reader dictionary; the second is for a
        // peer that reads event counters relative to the writer's previous event.
        for (key, relative) in [("sequence", false), ("sequenceEventCounters", true)] {
            let writer = WireDictionary(startingAt: start)
            writer.relativeEventCounters = relative
            let reader = WireDictionary(startingAt: start)
            for v in file[key] as! [JSON] {
                let delta = parseState(v["delta"])
                let bytes = WireDelta.encode(delta, with: writer)
                #expect(hex(bytes) == v["hex"] as! String, "\(v["name"]!)")
                #expect(VectorBuilder.form(bytes) == v["form"] as! String)
                #expect(try WireDelta.decode(unhex(v["hex"]), with: reader) == delta, "\(v["name"]!)")
            }
        }
        for v in file["decodeOnly"] as! [JSON] {
            let decoded = try WireDelta.decode(unhex(v["hex"]), with: WireDictionary(startingAt: u64(v["dictionaryStart"])))
            #expect(decoded == parseState(v["delta"]), "\(v["name"]!)")
        }
        for v in file["invalid"] as! [JSON] {
            #expect(throws: WireError.self, "\(v["name"]!)") {
                try WireDelta.decode(unhex(v["hex"]), with: WireDictionary(startingAt: start))
            }
        }
    }

    /// A session that has received nothing yet, of replica B at wall clock t0.
    static func machine() -> SessionStateMachine {
        SessionStateMachine(localReplica: Fixed.b, maxClockSkewMilliseconds: 300_000)
    }

    static func frame(_ hexText: Any?) throws -> (type: UInt8, body: [UInt8]) {
        var splitter = FrameSplitter()
        splitter.append(unhex(hexText))
        let next = try splitter.next()
        return try #require(next)
    }

    @Test("messages: every type round-trips; violations close the session with their reason code")
    func messages() throws {
        let file = try VectorFiles.load("messages.json")
        var hello: (type: UInt8, body: [UInt8])?
        for v in file["valid"] as! [JSON] {
            let (type, body) = try Self.frame(v["frame"])
            #expect(UInt64(type) == u64(v["type"]))
            let message = try Message.decode(type: type, body: body)
            #expect(hex(message.encodedFrame()) == v["frame"] as! String, "\(v["name"]!)")
            if case .hello = message { hello = (type, body) }
        }
        let validHello = try #require(hello)
        let receiver = file["receiver"] as! JSON
        #expect(u64(receiver["features"]) == UInt64(HelloFeatures([.deflatedChunks, .eventCounters]).rawValue))
        #expect(replica(receiver["replica"]) == Fixed.b && u64(receiver["wallClock"]) == Fixed.t0)
        var established = Self.machine()
        let opened = established.receive(type: validHello.type, body: validHello.body, now: Fixed.t0, in: .awaitingHello)
        guard case .helloAccepted? = opened.first else { Issue.record("the vector hello is not accepted: \(opened)"); return }
        for v in file["decodeOnly"] as! [JSON] {
            let (type, body) = try Self.frame(v["frame"])
            #expect(hex(try Message.decode(type: type, body: body).encodedFrame()) == v["equals"] as! String, "\(v["name"]!)")
        }
        for v in file["invalid"] as! [JSON] {
            var machine = Self.machine()
            // After the hello: a session waiting for the peer's auth, as a node's is then.
            var phase = PeerSession.Phase.awaitingHello
            if v["after"] as! String == "hello" {
                _ = machine.receive(type: validHello.type, body: validHello.body, now: Fixed.t0, in: phase)
                phase = .authenticating
            }
            let (type, body) = try Self.frame(v["frame"])
            let actions = machine.receive(type: type, body: body, now: Fixed.t0, in: phase)
            guard case .close(let reason, _, let notify)? = actions.last else {
                Issue.record("\(v["name"]!): not refused (\(actions))")
                continue
            }
            #expect(reason.rawValue == u64(v["reason"]) && notify, "\(v["name"]!): closed with \(reason)")
        }
    }

    @Test("SipHash-2-4-128 and state digests, with their record counts")
    func digests() throws {
        let file = try VectorFiles.load("digests.json")
        for v in file["siphash"] as! [JSON] {
            var h = StableHasher()
            for byte in unhex(v["input"]) { h.combine(byte) }
            let (high, low) = h.finalize()
            #expect(String(format: "%016llx", high) == v["high"] as! String && String(format: "%016llx", low) == v["low"] as! String)
        }
        for v in file["states"] as! [JSON] {
            let state = parseState(v["state"])
            #expect(state.digest.description == v["digest"] as! String, "\(v["name"]!)")
            #expect(UInt64(state.recordCount) == u64(v["records"]), "\(v["name"]!)")
        }
    }

    @Test("device keys, device IDs and their human forms")
    func identity() throws {
        let file = try VectorFiles.load("identity.json")
        for v in file["devices"] as! [JSON] {
            let key = DeviceKey(privateKey: try P256.Signing.PrivateKey(rawRepresentation: unhex(v["privateScalar"])))
            #expect(hex(Array(SHA256.hash(data: Array((v["label"] as! String).utf8)))) == v["privateScalar"] as! String)
            #expect(hex(key.publicKey.x963) == v["publicKey"] as! String)
            #expect(hex(key.privateKey.publicKey.derRepresentation) == v["spki"] as! String)
            #expect(hex(Array(SHA256.hash(data: unhex(v["spki"])).prefix(20))) == v["deviceID"] as! String)
            #expect(key.deviceID.humanForm == v["humanForm"] as! String && key.deviceID.shortForm == v["shortForm"] as! String)
        }
        for v in file["parse"] as! [JSON] {
            let text = v["text"] as! String
            if let expected = v["deviceID"] {
                #expect(hex(try DeviceID(parsing: text).bytes) == expected as! String, "\(text)")
            } else {
                do throws(DeviceIDParseError) {
                    _ = try DeviceID(parsing: text)
                    Issue.record("\(text) was accepted")
                } catch {
                    let kind = switch error {
                    case .badCharacter: "badCharacter"
                    case .wrongLength: "wrongLength"
                    }
                    #expect(kind == v["error"] as! String)
                }
            }
        }
    }

    @Test("invite codes: encoding, folding when read, refusals; old group secrets")
    func inviteCodes() throws {
        let file = try VectorFiles.load("invite-codes.json")
        for v in file["valid"] as! [JSON] {
            let code = InviteCode(groupID: GroupID(bytes: unhex(v["groupID"]))!, inviter: DeviceID(bytes: unhex(v["inviter"]))!,
                                  token: InviteToken(bytes: unhex(v["token"]))!)
            #expect(code.text == v["code"] as! String)
            #expect(try InviteCode(parsing: code.text) == code)
            #expect(hex(code.token.hash.bytes) == v["tokenHash"] as! String)
        }
        for v in file["parse"] as! [JSON] {
            let text = v["text"] as! String
            if let expected = v["code"] {
                #expect(try InviteCode(parsing: text).text == expected as! String, "\(text)")
            } else {
                do throws(InviteCodeParseError) {
                    _ = try InviteCode(parsing: text)
                    Issue.record("\(text) was accepted")
                } catch {
                    let kind = switch error {
                    case .badPrefix: "badPrefix"
                    case .oldStyleGroupSecret: "oldStyleGroupSecret"
                    case .wrongLength: "wrongLength"
                    case .badCharacter: "badCharacter"
                    case .checkMismatch: "checkMismatch"
                    }
                    #expect(kind == v["error"] as! String, "\(text)")
                }
            }
        }
        let recovery = file["recoveryCodes"] as! JSON
        for v in recovery["valid"] as! [JSON] {
            let key = DeviceKey(privateKey: try P256.Signing.PrivateKey(rawRepresentation: unhex(v["privateKey"])))
            let code = RecoveryCode(groupID: GroupID(bytes: unhex(v["groupID"]))!, key: key)
            #expect(code.text == v["code"] as! String)
            #expect(try RecoveryCode(parsing: code.text) == code)
            #expect(hex(key.deviceID.bytes) == v["recoveryDeviceID"] as! String)
        }
        for v in recovery["parse"] as! [JSON] {
            let text = v["text"] as! String
            if let expected = v["code"] {
                #expect(try RecoveryCode(parsing: text).text == expected as! String, "\(text)")
            } else {
                do throws(RecoveryCodeParseError) {
                    _ = try RecoveryCode(parsing: text)
                    Issue.record("\(text) was accepted")
                } catch {
                    let kind = switch error {
                    case .badPrefix: "badPrefix"
                    case .wrongLength: "wrongLength"
                    case .badCharacter: "badCharacter"
                    case .checkMismatch: "checkMismatch"
                    case .notAKey: "notAKey"
                    }
                    #expect(kind == v["error"] as! String, "\(text)")
                }
            }
        }
        for v in file["legacyGroupSecrets"] as! [JSON] {
            let secret = GroupSecret(bytes: unhex(v["secret"]))
            #expect(secret.inviteCode == v["code"] as! String)
            #expect(try GroupSecret(inviteCode: (v["code"] as! String).lowercased()) == secret)
            #expect(hex(secret.preSharedKey) == v["tlsPSK"] as! String)
            #expect("peersync/" + secret.groupTag == v["pskIdentity"] as! String)
            let legacy = LegacyGroupKey(groupSecret: secret.bytes)
            #expect(hex(legacy.publicKey.x963) == v["legacyKeyPublic"] as! String)
            #expect(hex(legacy.groupID.bytes) == v["upgradedGroupID"] as! String)
        }
    }

    @Test("auth transcript bytes; the signature verifies, and its high-S twin and wrong transcripts do not")
    func auth() throws {
        let file = try VectorFiles.load("auth.json")
        func check(_ v: JSON, valid: Bool) throws {
            let group = GroupID(bytes: unhex(v["groupID"]))!
            let signer = replica(v["signerReplica"])
            let key = try #require(DevicePublicKey(x963: unhex(v["signerKey"])))
            let canonical = SessionAuth.transcript(signerNonce: unhex(v["signerNonce"]), verifierNonce: unhex(v["verifierNonce"]),
                                                   signer: signer, group: group.bytes)
            if valid { #expect(hex(canonical) == v["transcript"] as! String) }
            // Verified the way a receiver does: against the transcript it builds itself.
            let verdict = SessionAuth.verify(unhex(v["signature"]), key: key, peerNonce: unhex(v["signerNonce"]),
                                             ownNonce: unhex(v["verifierNonce"]), peer: signer, group: group)
            let overStated = key.isValidSignature(unhex(v["signature"]), for: unhex(v["transcript"]))
            #expect(verdict == (valid && overStated), "\(v["name"] ?? "valid")")
            if valid { #expect(overStated) }
        }
        for v in file["valid"] as! [JSON] { try check(v, valid: true) }
        for v in file["invalid"] as! [JSON] { try check(v, valid: false) }
    }

    @Test("discovery tags and TXT records")
    func discovery() throws {
        let file = try VectorFiles.load("discovery.json")
        for v in file["tags"] as! [JSON] {
            #expect(GroupID(bytes: unhex(v["groupID"]))!.discoveryTag == v["tag"] as! String)
        }
        for v in file["txt"] as! [JSON] {
            let entries = (v["entries"] as! [[String]]).map { (key: $0[0], value: $0[1]) }
            #expect(hex(try #require(TXTRecord.encode(entries))) == v["hex"] as! String)
            let decoded = unhex(v["hex"]).withUnsafeBytes { TXTRecord.decode($0) }
            #expect(decoded == Dictionary(uniqueKeysWithValues: entries.map { ($0.key, $0.value) }))
        }
    }

    @Test("context files and bundles open with the right keys; tampered or foreign ones are refused")
    func bundles() throws {
        let file = try VectorFiles.load("bundles.json")
        let contextFile = file["contextFile"] as! JSON
        let group = GroupID(bytes: unhex(contextFile["groupID"]))!
        let bytes = unhex(contextFile["hex"])
        let opened = try SyncBundle.openContext(bytes, groupID: group)
        let (key, context) = (opened.device, opened.context)
        #expect(hex(key.x963) == contextFile["deviceKey"] as! String && context == parseContext(contextFile["context"]))
        var tampered = bytes
        tampered[tampered.count - 70] ^= 1  // inside the context blob, before the signature
        #expect(throws: BundleError.tampered) { try SyncBundle.openContext(tampered, groupID: group) }
        let other = GroupID(bytes: [UInt8](repeating: 7, count: 16))!
        #expect(throws: BundleError.otherGroup) { try SyncBundle.openContext(bytes, groupID: other) }

        let bundleJSON = file["bundle"] as! JSON
        let recipient = DeviceKey(privateKey: try P256.Signing.PrivateKey(rawRepresentation: unhex(bundleJSON["recipientPrivateScalar"])))
        let bundle = unhex(bundleJSON["hex"])
        let (header, delta) = try SyncBundle.open(bundle, groupID: group, me: recipient)
        #expect(hex(header.sender.x963) == bundleJSON["senderKey"] as! String && header.senderReplica == replica(bundleJSON["senderReplica"]))
        #expect(header.senderName == bundleJSON["senderName"] as! String && header.createdAt == u64(bundleJSON["createdAt"]))
        #expect(header.records == u64(bundleJSON["records"]) && delta == parseState(bundleJSON["delta"]))
        var flipped = bundle
        flipped[flipped.count - 80] ^= 1
        #expect(throws: BundleError.tampered) { try SyncBundle.open(flipped, groupID: group, me: recipient) }
        #expect(throws: BundleError.otherGroup) { try SyncBundle.open(bundle, groupID: other, me: recipient) }
        #expect(throws: BundleError.notForThisDevice) { try SyncBundle.open(bundle, groupID: group, me: Fixed.keyA) }

        func kind(_ error: BundleError) -> String {
            switch error {
            case .notABundle: "notABundle"
            case .unsupportedVersion: "unsupportedVersion"
            case .otherGroup: "otherGroup"
            case .notForThisDevice: "notForThisDevice"
            case .tampered: "tampered"
            default: "\(error)"
            }
        }
        for v in file["invalidContextFiles"] as! [JSON] {
            do throws(BundleError) {
                _ = try SyncBundle.openContext(unhex(v["hex"]), groupID: GroupID(bytes: unhex(v["groupID"]))!)
                Issue.record("\(v["name"]!) was accepted")
            } catch {
                #expect(kind(error) == v["error"] as! String, "\(v["name"]!)")
            }
        }
        for v in file["invalidBundles"] as! [JSON] {
            let me = DeviceKey(privateKey: try P256.Signing.PrivateKey(rawRepresentation: unhex(v["recipientPrivateScalar"])))
            do throws(BundleError) {
                _ = try SyncBundle.open(unhex(v["hex"]), groupID: GroupID(bytes: unhex(v["groupID"]))!, me: me)
                Issue.record("\(v["name"]!) was accepted")
            } catch {
                #expect(kind(error) == v["error"] as! String, "\(v["name"]!)")
            }
        }
    }
}
