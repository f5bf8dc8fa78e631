import Foundation
import Logging
@testable import PeerSync
import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncNetwork
import PeerSyncRelay
import PeerSyncReplication
@testable import PeerSyncSeal
import PeerSyncTestSupport
import ShiftSchedulerModel
import Synchronization
import Testing

/// A relay in this process on 127.0.0.1: real SQLite file, real TCP, real TLS.
final class TestRelay: Sendable {
    let directory: String
    let service: RelayService
    let server: RelayServer
    let port: UInt16
    let storage: WithholdingStorage

    init(limits: SyncLimits = SyncLimits()) async throws {
        directory = try makeTemporaryDirectory("peersync-relay")
        storage = WithholdingStorage(try SQLiteRelayStorage(path: directory + "/relay.sqlite"))
        service = try RelayService(key: .generate(), enrolSecret: RelayService.makeSecret(), storage: storage, limits: limits,
                                   logger: testLogger("relay"))
        server = try RelayServer(service: service, listen: .loopback(0), limits: limits, logger: testLogger("relay"))
        port = try await server.start()
    }

    var address: PeerAddress { .loopback(port) }
    var code: String { service.code.description }

    func stop() async {
        await server.stop()
        removeTemporaryDirectory(directory)
    }
}

/// A relay storage that can withhold blobs when streaming them (a relay that "silently
/// swallows a change"), for the withholding watch.
final class WithholdingStorage: RelayStorage {
    let base: SQLiteRelayStorage
    private let withhold = Mutex<(@Sendable (SealedBlob) -> Bool)?>(nil)

    init(_ base: SQLiteRelayStorage) { self.base = base }

    func withholding(_ predicate: (@Sendable (SealedBlob) -> Bool)?) { withhold.withLock { $0 = predicate } }

    func load() throws -> [StoredRelayGroup] { try base.load() }
    func saveMembers(_ members: RelayMembers) throws { try base.saveMembers(members) }
    func deleteGroup(_ group: GroupID) throws { try base.deleteGroup(group) }
    func saveEnvelopes(_ envelopes: [KeyEnvelope]) throws { try base.saveEnvelopes(envelopes) }
    func saveReports(_ reports: [SeenReport], group: GroupID) throws { try base.saveReports(reports, group: group) }
    func insert(_ blob: SealedBlob, dropping: [Int64]) throws -> Int64 { try base.insert(blob, dropping: dropping) }
    func storedBytes(of group: GroupID) throws -> Int { try base.storedBytes(of: group) }
    func bytes(of ids: [Int64]) throws -> [Int64: [UInt8]] {
        let found = try base.bytes(of: ids)
        guard let predicate = withhold.withLock({ $0 }) else { return found }
        return found.filter { _, bytes in !((try? SealedBlob(bytes: bytes)).map(predicate) ?? false) }
    }
}

/// Issue 33: a blind relay that carries the group's data and cannot read it.
@Suite("Relays", .timeLimit(.minutes(6)))
struct RelayTests {
    /// A group of `names.count` devices that met once (all admitted, every one holding the
    /// roster), then parted: no direct sessions after this.
    private func team(_ names: [String]) async throws -> (replicas: [Replica], directories: [String]) {
        let directories = try names.map { _ in try makeTemporaryDirectory("peersync-relay-team") }
        let office = try Replica.create(at: directories[0], name: names[0], logger: testLogger(names[0]))
        var replicas = [office]
        for (index, name) in names.enumerated().dropFirst() {
            replicas.append(try Replica.join(at: directories[index], name: name, invite: try await office.invite(), logger: testLogger(name)))
        }
        let port = try await office.startSync(SyncConfiguration(security: .tls, listen: .loopback(0)))
        for replica in replicas.dropFirst() {
            try await replica.startSync(SyncConfiguration(security: .tls, listen: nil, peers: [.loopback(port)]))
        }
        let count = names.count
        try #require(await eventually { replicas.allSatisfy { $0.roster().activeDevices.count == count } })
        for replica in replicas { await replica.stopSync() }
        return (replicas, directories)
    }

    private func viaRelay(_ replica: Replica, _ relay: TestRelay, bound: Duration = .seconds(30)) async throws {
        var timing = SyncTiming()
        timing.relayWithholdingBound = bound
        try await replica.startSync(SyncConfiguration(security: .tls, listen: nil, timing: timing, relays: [relay.address]))
    }

    private func names(_ replica: Replica) throws -> Set<String> { Set(try replica.fetchAll(Location.self).map(\.name)) }

    @Test func twoDevicesThatNeverMeetConvergeThroughARelayThatCannotReadThem() async throws {
        let relay = try await TestRelay()
        let (replicas, directories) = try await team(["office", "ben"])
        defer { for directory in directories { removeTemporaryDirectory(directory) } }
        let (office, ben) = (replicas[0], replicas[1])
        try await office.enrolRelay(at: relay.address, code: relay.code)
        #expect(office.roster().relays.count == 1)
        #expect(office.currentDataKey() != nil)

        try await viaRelay(office, relay)
        try await office.save(Location(name: "Ward 7 secret-marker-4711"))
        try await viaRelay(ben, relay)
        // Ben gets the roster's relay entry, the data key and the record through the relay alone.
        #expect(await eventually { (try? self.names(ben)) == ["Ward 7 secret-marker-4711"] })
        try await ben.save(Location(name: "Night desk"))
        #expect(await eventually { (try? self.names(office)) == ["Ward 7 secret-marker-4711", "Night desk"] })
        #expect(await eventually { office.state.records.digest == ben.state.records.digest })
        #expect(await eventually { await office.relayStatus().first?.connected == true })

        // The relay's file holds no plaintext of a synced record.
        await relay.server.stop()
        for file in try FileManager.default.contentsOfDirectory(atPath: relay.directory) {
            let bytes = try Data(contentsOf: URL(fileURLWithPath: relay.directory + "/" + file))
            #expect(bytes.range(of: Data("secret-marker-4711".utf8)) == nil, "\(file) holds the marker")
            #expect(bytes.range(of: Data("Night desk".utf8)) == nil, "\(file) holds a record's name")
        }
        for replica in replicas { await replica.close() }
        await relay.stop()
    }

    @Test func aDeviceRemovedWhileOfflineIsRefusedByTheRelayAndCannotOpenLaterBlobs() async throws {
        let relay = try await TestRelay()
        let (replicas, directories) = try await team(["office", "ben", "carla"])
        defer { for directory in directories { removeTemporaryDirectory(directory) } }
        let (office, ben, carla) = (replicas[0], replicas[1], replicas[2])
        try await office.enrolRelay(at: relay.address, code: relay.code)
        try await viaRelay(office, relay)
        try await viaRelay(ben, relay)
        try await office.save(Location(name: "before"))
        #expect(await eventually { (try? self.names(ben)) == ["before"] })

        // Carla's phone is lost while offline: removed; the relay hears the new member list.
        try await office.removeDevice(carla.deviceID)
        #expect(await eventually { await relay.service.group(office.groupID)?.admits(carla.deviceID) == false })
        try await ben.save(Location(name: "after"))
        #expect(await eventually { (try? self.names(office)) == ["before", "after"] })

        // The relay refuses her.
        try await viaRelay(carla, relay)
        #expect(await eventually { (await carla.relayStatus().first?.lastError ?? "").contains("not a member") })
        #expect(try names(carla) == [])

        // Handed every blob the relay holds, she opens none written after her removal.
        let group = try #require(await relay.service.group(office.groupID))
        let blobs = try relay.storage.base.bytes(of: group.plan(for: [:])).values.map { try SealedBlob(bytes: $0) }
        let afterRemoval = blobs.filter { $0.writer == ben.deviceID }
        #expect(!afterRemoval.isEmpty)
        let (applied, refused) = try carla.applyRelayBlobs(afterRemoval, relay: "test", maxClockSkew: .seconds(300))
        #expect(applied.isEmpty && refused.count == afterRemoval.count)
        #expect(refused.allSatisfy { $0.contains("does not hold") })
        #expect(try !names(carla).contains("after"))
        #expect(await eventually { office.state.records.digest == ben.state.records.digest })
        for replica in replicas { await replica.close() }
        await relay.stop()
    }

    @Test func alteredReplayedAndReattributedBlobsAreRefused() async throws {
        let relay = try await TestRelay()
        let (replicas, directories) = try await team(["office", "ben"])
        let (others, otherDirectories) = try await team(["elsewhere"])
        defer { for directory in directories + otherDirectories { removeTemporaryDirectory(directory) } }
        let (office, ben, elsewhere) = (replicas[0], replicas[1], others[0])
        try await office.enrolRelay(at: relay.address, code: relay.code)
        try await elsewhere.rotateDataKey()
        // Ben holds the data key (met the office after the enrolment).
        try await viaRelay(office, relay)
        try await viaRelay(ben, relay)
        #expect(await eventually { ben.currentDataKey() != nil })
        await ben.stopSync()
        try await office.save(Location(name: "genuine"))
        let (blob, _) = try #require(try office.sealEvents(of: office.replicaID, after: office.state.records.context.contiguousCounter(of: office.replicaID) - 1))

        // Altered: one ciphertext byte flipped.
        var altered = blob.bytes
        altered[altered.count - 70] ^= 1
        // Re-attributed: the writer field names Ben (the signature is the office's).
        let reattributed = SealedBlob(kind: blob.kind, groupID: blob.groupID, epoch: blob.epoch, keyID: blob.keyID, writer: ben.deviceID,
                                      replica: blob.replica, firstCounter: blob.firstCounter, lastCounter: blob.lastCounter, head: blob.head,
                                      nonce: blob.nonce, covers: blob.covers, ciphertext: blob.ciphertext, signature: blob.signature)
        // Replayed into another group: a genuine blob of the other group.
        try await elsewhere.save(Location(name: "other group"))
        let foreign = try #require(try elsewhere.sealEvents(of: elsewhere.replicaID, after: 0)).blob
        for bad in [try SealedBlob(bytes: altered), reattributed, foreign] {
            let (applied, refused) = try ben.applyRelayBlobs([bad], relay: "relay R", maxClockSkew: .seconds(300))
            #expect(applied.isEmpty && refused.count == 1)
        }
        #expect(try names(ben) == [])
        let (applied, _) = try ben.applyRelayBlobs([blob], relay: "relay R", maxClockSkew: .seconds(300))
        #expect(applied.count == 1)
        #expect(try names(ben) == ["genuine"])
        for replica in replicas + others { await replica.close() }
        await relay.stop()
    }

    @Test func aRelayThatWithholdsABlobIsNamedWithinTheBoundAndADirectSessionHeals() async throws {
        let relay = try await TestRelay()
        let (replicas, directories) = try await team(["office", "ben"])
        defer { for directory in directories { removeTemporaryDirectory(directory) } }
        let (office, ben) = (replicas[0], replicas[1])
        try await office.enrolRelay(at: relay.address, code: relay.code)
        try await viaRelay(office, relay)
        // Three writes, each stored at the relay before the next.
        var middle: ClosedRange<UInt64>?
        for name in ["one", "two", "three"] {
            let before = office.state.records.context.contiguousCounter(of: office.replicaID)
            try await office.save(Location(name: name))
            let after = office.state.records.context.contiguousCounter(of: office.replicaID)
            if name == "two" { middle = (before + 1)...after }
            #expect(await eventually { await relay.service.group(office.groupID)?.covered[office.replicaID] == after })
        }
        let withheld = try #require(middle)
        let officeReplica = office.replicaID
        relay.storage.withholding { $0.replica == officeReplica && $0.firstCounter == withheld.lowerBound }

        try await viaRelay(ben, relay, bound: .milliseconds(300))
        #expect(await eventually { (try? self.names(ben)) == ["one", "three"] })
        let line = "writer \(office.replicaID.shortDescription)'s counters \(withheld.lowerBound)–"
        #expect(await eventually { await ben.relayStatus().first?.withheld.contains { $0.hasPrefix(line) } == true })
        #expect(await ben.syncHealth().relays.first?.withheld.contains { $0.hasPrefix(line) } == true)

        // They meet: a direct session fills the gap and the report clears.
        let port = try await office.startSync(SyncConfiguration(security: .tls, listen: .loopback(0), relays: [relay.address]))
        var timing = SyncTiming()
        timing.relayWithholdingBound = .milliseconds(300)
        try await ben.startSync(SyncConfiguration(security: .tls, listen: nil, peers: [.loopback(port)], timing: timing, relays: [relay.address]))
        #expect(await eventually { (try? self.names(ben)) == ["one", "two", "three"] })
        #expect(await eventually { await ben.relayStatus().first?.withheld.isEmpty == true })
        for replica in replicas { await replica.close() }
        await relay.stop()
    }

    /// Relay bytes for `group` once only a snapshot and what follows it are held.
    private func settledBytes(_ relay: TestRelay, _ group: GroupID) async -> Int? {
        guard let state = await relay.service.group(group) else { return nil }
        return state.byteCount
    }

    @Test func recordsCreatedAndDeletedThroughTheRelayLeaveItsStorageNearAFreshGroups() async throws {
        let relay = try await TestRelay()
        let (replicas, directories) = try await team(["office", "ben"])
        let (fresh, freshDirectories) = try await team(["office2", "ben2"])
        defer { for directory in directories + freshDirectories { removeTemporaryDirectory(directory) } }
        for admin in [replicas[0], fresh[0]] { try await admin.enrolRelay(at: relay.address, code: relay.code) }
        for replica in replicas + fresh { try await viaRelay(replica, relay) }
        let (office, ben) = (replicas[0], replicas[1])

        // 1,000 records created, then deleted, through the relay.
        let places = (0..<1_000).map { Location(name: "place \($0)", address: String(repeating: "x", count: 40)) }
        try await office.batch { batch in for place in places { try batch.save(place) } }
        #expect(await eventually { (try? ben.fetchAll(Location.self).count) == 1_000 })
        try await ben.batch { batch in for place in places { _ = try batch.delete(Location.self, id: place.id) } }
        #expect(await eventually { (try? office.fetchAll(Location.self).count) == 0 })
        let grown = try #require(await settledBytes(relay, office.groupID))

        // Compaction at causal stability, with the reports carried by the relay; then each
        // device's snapshot lets the relay drop every blob it covers.
        let compacting = ContinuousClock.now
        #expect(await eventually { office.compactionStatus().purgedRecords >= 1_000 && ben.compactionStatus().purgedRecords >= 1_000 })
        print("relay compaction: both devices purged in \(ContinuousClock.now - compacting)")
        for replica in fresh { await replica.uploadRelaySnapshot() }
        #expect(await eventually { await relay.service.group(fresh[0].groupID)?.blobCount == 1 })
        let baseline = try #require(await settledBytes(relay, fresh[0].groupID))
        var after = grown
        let near = await eventually {
            after = await self.settledBytes(relay, office.groupID) ?? .max
            return Double(after) <= Double(baseline) * 1.10
        }
        print("relay storage: \(grown) bytes after 1,000 creates and deletes, \(after) after compaction; a fresh group's \(baseline)")
        #expect(near, "\(after) bytes for the compacted group, \(baseline) for a fresh one")
        #expect(await eventually { office.state.records.digest == ben.state.records.digest })
        for replica in replicas + fresh { await replica.close() }
        await relay.stop()
    }

    @Test func aDeviceWithAnInviteJoinsThroughTheRelayWithNoOtherMemberOnItsNetwork() async throws {
        let relay = try await TestRelay()
        let directories = try (0..<2).map { _ in try makeTemporaryDirectory("peersync-relay-join") }
        defer { for directory in directories { removeTemporaryDirectory(directory) } }
        let office = try Replica.create(at: directories[0], name: "office", logger: testLogger("office"))
        try await office.enrolRelay(at: relay.address, code: relay.code)
        try await office.save(Location(name: "Head office"))
        try await viaRelay(office, relay)
        // Dana never meets the office: her invite reaches it through the relay.
        let dana = try Replica.join(at: directories[1], name: "dana", invite: try await office.invite(), logger: testLogger("dana"))
        #expect(await dana.pendingJoin != nil)
        try await viaRelay(dana, relay)
        #expect(await eventually { office.roster().isActive(dana.deviceID) })
        #expect(await eventually { await dana.pendingJoin == nil })
        #expect(await eventually { (try? self.names(dana)) == ["Head office"] })
        try await dana.save(Location(name: "Dana's site"))
        #expect(await eventually { (try? self.names(office)) == ["Head office", "Dana's site"] })
        #expect(await eventually { office.state.records.digest == dana.state.records.digest })
        // A stranger with a made-up invite gets nowhere: the office refuses its request.
        let strangerDirectory = try makeTemporaryDirectory("peersync-relay-join")
        defer { removeTemporaryDirectory(strangerDirectory) }
        let forged = InviteCode(groupID: office.groupID, inviter: office.deviceID, token: InviteToken.generate())
        let stranger = try Replica.join(at: strangerDirectory, name: "mallory", invite: forged, logger: testLogger("mallory"))
        try await viaRelay(stranger, relay)
        #expect(await eventually { (await stranger.relayStatus().first?.lastError ?? "").contains("waiting for the inviter") })
        #expect(!office.roster().devices.keys.contains(stranger.deviceID))
        for replica in [office, dana, stranger] { await replica.close() }
        await relay.stop()
    }

    @Test func keysOfAnEpochWhoseAdminWasRemovedStillOpenWhatWasSealedWithThem() async throws {
        let (replicas, directories) = try await team(["office", "ben", "carla"])
        defer { for directory in directories { removeTemporaryDirectory(directory) } }
        let (office, ben, carla) = (replicas[0], replicas[1], replicas[2])
        try await office.setRole(ben.deviceID, to: .admin)
        try await office.rotateDataKey()
        try await office.save(Location(name: "sealed in epoch 0"))
        let port = try await ben.startSync(SyncConfiguration(security: .tls, listen: .loopback(0)))
        for replica in [office, carla] { try await replica.startSync(SyncConfiguration(security: .tls, listen: nil, peers: [.loopback(port)])) }
        #expect(await eventually { carla.currentDataKey() != nil && ben.roster().role(of: ben.deviceID) == .admin })
        let (blob, _) = try #require(try office.sealEvents(of: office.replicaID, after: 0))
        try await carla.cacheDataKeys()
        // Ben removes the office: its envelopes stop counting everywhere.
        await office.stopSync()
        try await ben.removeDevice(office.deviceID)
        #expect(await eventually { carla.roster().isRemoved(office.deviceID) && carla.dataKeys().allSatisfy { $0.epoch != 0 } })
        // What it sealed before still opens on Carla, from her cache.
        await carla.stopSync()
        let fresh = try Replica.open(at: directories[2], name: "carla", logger: testLogger("carla"))
        let (applied, refused) = try fresh.applyRelayBlobs([blob], relay: "test", maxClockSkew: .seconds(300))
        #expect(refused.isEmpty, "\(refused)")
        #expect(applied.count == 1)
        for replica in replicas { await replica.close() }
        await fresh.close()
    }

    /// Puts `directory` back as `backup` holds it, writing into the same files (same inodes:
    /// opening does not see the restore).
    private func restoreInPlace(_ directory: String, from backup: [String: Data]) throws {
        let files = try FileManager.default.contentsOfDirectory(atPath: directory)
        for file in files where backup[file] == nil { try FileManager.default.removeItem(atPath: directory + "/" + file) }
        for (file, data) in backup {
            let handle = try #require(FileHandle(forWritingAtPath: directory + "/" + file) ?? {
                _ = FileManager.default.createFile(atPath: directory + "/" + file, contents: nil)
                return FileHandle(forWritingAtPath: directory + "/" + file)
            }())
            try handle.truncate(atOffset: 0)
            try handle.write(contentsOf: data)
            try handle.close()
        }
    }

    @Test func aStorePutBackInPlaceThatWroteOfflineMeetsItsLostFutureAtTheRelayAndNothingSplits() async throws {
        let relay = try await TestRelay()
        let (replicas, directories) = try await team(["office", "ben"])
        defer { for directory in directories { removeTemporaryDirectory(directory) } }
        let office = replicas[0]
        var ben = replicas[1]
        try await office.enrolRelay(at: relay.address, code: relay.code)
        try await viaRelay(office, relay)
        try await viaRelay(ben, relay)
        try await ben.save(Location(name: "b1"))
        #expect(await eventually { (try? self.names(office)) == ["b1"] })
        await ben.close()
        let files = try FileManager.default.contentsOfDirectory(atPath: directories[1])
        let backup = Dictionary(uniqueKeysWithValues: try files.map { ($0, try Data(contentsOf: URL(fileURLWithPath: directories[1] + "/" + $0))) })
        // Its lost future: two more writes, stored at the relay.
        ben = try Replica.open(at: directories[1], name: "ben", logger: testLogger("ben"))
        let lostReplica = ben.replicaID
        try await viaRelay(ben, relay)
        try await ben.save(Location(name: "b2"))
        try await ben.save(Location(name: "b3"))
        let lostCounter = ben.state.records.context.maxCounter(of: lostReplica)
        #expect(await eventually { await relay.service.group(office.groupID)?.covered[lostReplica] == lostCounter })
        let group = try #require(await relay.service.group(office.groupID))
        let lostBlobs = try relay.storage.base.bytes(of: group.plan(for: [:])).values.map { try SealedBlob(bytes: $0) }
            .filter { $0.replica == lostReplica }
        await ben.close()
        // Put back in place (opening cannot tell), and written on offline: its counters are the
        // lost future's again.
        try restoreInPlace(directories[1], from: backup)
        ben = try Replica.open(at: directories[1], name: "ben", logger: testLogger("ben"))
        #expect(ben.replicaID == lostReplica)
        try await ben.save(Location(name: "b4, offline after the restore"))
        // Shown the lost future's blobs, it continues as a new replica, its offline write moved.
        let (applied, refused) = try ben.applyRelayBlobs(lostBlobs, relay: "test", maxClockSkew: .seconds(300))
        #expect(refused.isEmpty, "\(refused)")
        #expect(applied.count == lostBlobs.count)
        #expect(ben.replicaID != lostReplica)
        #expect(try names(ben) == ["b1", "b2", "b3", "b4, offline after the restore"])
        try await viaRelay(ben, relay)
        #expect(await eventually { (try? self.names(office)) == ["b1", "b2", "b3", "b4, offline after the restore"] })
        #expect(await eventually { office.state.records.digest == ben.state.records.digest })
        await office.close()
        await ben.close()
        await relay.stop()
    }
}
