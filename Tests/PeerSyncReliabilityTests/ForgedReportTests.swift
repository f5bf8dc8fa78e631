import Foundation
import Logging
import PeerSync
@testable import PeerSyncReplication
@testable import PeerSyncNetwork
import PeerSyncTestSupport
@testable import PeerSyncWire
import Testing
import ShiftSchedulerModel

/// No member can talk a node into forgetting (issue 32): hand-built `seen` frames from an
/// admitted member, over real TLS, never make a node purge what another device has not seen.
@Suite("Forged compaction reports", .ownThread, .serialized)
struct ForgedReportTests {
    let group = try! LocalGroup.make(names: ["n", "a", "c"])

    func open(_ directory: String, _ name: String, _ lines: RecordingLogHandler.Lines = .init()) throws -> Replica {
        let logger = RecordingLogHandler.logger(name, into: lines)
        if FileManager.default.fileExists(atPath: ReplicaStore.path(in: directory)) {
            return try Replica.open(at: directory, logger: logger)
        }
        return try Replica.create(at: directory, member: group.names.firstIndex(of: name)!, of: group, logger: logger)
    }

    func sync(_ replica: Replica, peers: [UInt16] = []) async throws -> UInt16 {
        try await replica.startSync(SyncConfiguration(security: .tls, listen: .loopback(0), peers: peers.map { .loopback($0) }))
    }

    func names(_ replica: Replica) throws -> [String] { try replica.fetchAll(Location.self).map(\.name).sorted() }

    /// The unsigned gossip of the previous version (format 01): reports and a `stable` context.
    func unsignedSeen(reports: [ReplicaID: CausalContext], stable: CausalContext) -> [UInt8] {
        var body: [UInt8] = [1]
        Varint.append(UInt64(reports.count), to: &body)
        for (replica, context) in reports.sorted(by: { $0.key < $1.key }) {
            body += replica.bigEndianBytes
            let blob = context.encodedBlob()
            Varint.append(UInt64(blob.count), to: &body)
            body += blob
        }
        let blob = stable.encodedBlob()
        Varint.append(UInt64(blob.count), to: &body)
        return Frame.encode(type: SeenMessage.kind, body: body + blob)
    }

    @Test("a member's forged reports (unsigned whole-context reports and stable, another device's name, another device's replica; its own report claiming everything) purge nothing while c has not seen the delete; after c returns the record ends as the CRDT says, digests equal, no repair",
          arguments: [false, true])
    func forgedReportsPurgeNothing(cEditsOffline: Bool) async throws {
        let (dirN, dirA, dirC) = try (makeTemporaryDirectory("forge-n"), makeTemporaryDirectory("forge-a"), makeTemporaryDirectory("forge-c"))
        defer { [dirN, dirA, dirC].forEach(removeTemporaryDirectory) }
        let lines = RecordingLogHandler.Lines()
        let n = try open(dirN, "n", lines)
        let a = try open(dirA, "a", lines)
        let c = try open(dirC, "c", lines)
        let portN = try await sync(n)
        _ = try await sync(a, peers: [portN])
        _ = try await sync(c, peers: [portN])
        let doomed = Location(name: "L")
        try await n.save(doomed)
        #expect(await eventually { (try? names(c)) == ["L"] && (try? names(a)) == ["L"] })
        // c goes offline; n deletes L.
        await c.stopSync()
        await a.stopSync()
        try await n.delete(Location.self, id: doomed.id)
        let deleted = n.state.context
        #expect(try await n.compact().status.heldBackBy.contains { $0.name == "c" })

        let everything = n.state.context
        let ownReportTime = HybridLogicalClock.wallClock() + 60_000
        let keyA = group.keys[1], keyC = group.keys[2]
        let forgeries: [(String, [UInt8], CloseReason?)] = [
            ("unsigned whole-context reports and a stable context",
             unsignedSeen(reports: [c.replicaID: everything, a.replicaID: everything, n.replicaID: everything], stable: everything), .malformed),
            ("a report naming device c, signed by a's key", {
                let body = SeenReport.body(groupID: group.groupID.bytes, device: keyC.deviceID.bytes, replica: c.replicaID,
                                           time: HybridLogicalClock.wallClock(), context: everything)
                let forged = SeenReport(groupID: group.groupID.bytes, device: keyC.deviceID.bytes, replica: c.replicaID,
                                        time: HybridLogicalClock.wallClock(), context: everything,
                                        signature: keyA.signature(for: SeenReport.signingDomain + body))
                return SeenMessage.encodedFrame([forged])
            }(), .forgedReport),
            ("a's own signature on a report for c's replica",
             SeenMessage.encodedFrame([SeenReport.signed(by: keyA, group: group.groupID, replica: c.replicaID, time: HybridLogicalClock.wallClock(),
                                                         context: everything)]), .forgedReport),
            ("a's own report, signed, claiming it has seen everything",
             SeenMessage.encodedFrame([SeenReport.signed(by: keyA, group: group.groupID, replica: a.replicaID, time: ownReportTime,
                                                         context: everything)]), nil),
        ]
        for (what, frame, expected) in forgeries {
            // A refusal ends the session; the accepted report is waited for in n's store.
            let store = n.store
            let aReplica = a.replicaID
            let recorded: @Sendable () -> Bool = { store.compaction.reportedAt(aReplica) == ownReportTime }
            let accepted = expected != nil ? nil : recorded
            let reason = try await DevicesTests.send([frame], to: portN, as: group.identity(1), until: accepted)
            #expect(reason == expected, "\(what): closed with \(String(describing: reason))")
            let report = try await n.compact()
            #expect(report.status.purgedRecords == 0, "\(what): n purged")
            #expect(report.status.heldBackBy.contains { $0.name == "c" }, "\(what): \(report.status.summary())")
        }
        #expect(n.state.records.record(RecordKey(collection: Location.collection, id: doomed.id)) != nil, "L is still held (deleted)")

        // c comes back (having edited L offline, or not): the CRDT decides, on both, with no repair.
        if cEditsOffline {
            var edited = doomed
            edited.address = "edited offline"
            try await c.save(edited)
        }
        _ = try await sync(c, peers: [portN])
        let expected = cEditsOffline ? ["L"] : []
        #expect(await eventually(timeout: .seconds(30)) {
            (try? names(n)) == expected && (try? names(c)) == expected && n.state.digest == c.state.digest
        }, "n: \((try? names(n)) ?? []) c: \((try? names(c)) ?? [])")
        #expect(n.state.context.includes(deleted))
        let (repairsN, repairsC) = (await n.syncHealth().repairs, await c.syncHealth().repairs)
        #expect(repairsN == 0 && repairsC == 0)
        if !cEditsOffline {
            // Now every device has seen the delete (a by its own signed word): it is purged.
            _ = try await sync(a, peers: [portN])
            #expect(await eventually(timeout: .seconds(60)) {
                n.compactionStatus().purgedRecords == 1 && c.compactionStatus().purgedRecords == 1
            }, "n: \(n.compactionStatus().summary()) c: \(c.compactionStatus().summary())")
        }
        for replica in [n, a, c] { await replica.stopSync() }
    }
}
