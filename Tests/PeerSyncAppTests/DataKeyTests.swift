import Foundation
@testable import PeerSync
import PeerSyncIdentity
import PeerSyncSeal
import PeerSyncTestSupport
import Testing

/// The group's data keys by epoch (issue 33, PROTOCOL §20.2): delivered to every active device
/// in envelopes that travel with ordinary sync; a new epoch at removal that the removed device
/// cannot open.
@Suite("Data keys by epoch", .timeLimit(.minutes(6)))
struct DataKeyTests {
    private func syncAll(_ replicas: [Replica]) async throws {
        let port = try await replicas[0].startSync(SyncConfiguration(security: .tls, listen: .loopback(0)))
        for replica in replicas.dropFirst() {
            try await replica.startSync(SyncConfiguration(security: .tls, listen: nil, peers: [.loopback(port)]))
        }
    }

    @Test func keysReachEveryDeviceAndARemovalStartsAnEpochTheRemovedCannotOpen() async throws {
        let directories = try (0..<3).map { _ in try makeTemporaryDirectory("peersync-keys") }
        defer { for directory in directories { removeTemporaryDirectory(directory) } }
        let office = try Replica.create(at: directories[0], name: "office", logger: testLogger("office"))
        let ben = try Replica.join(at: directories[1], name: "ben", invite: try await office.invite(), logger: testLogger("ben"))
        let carla = try Replica.join(at: directories[2], name: "carla", invite: try await office.invite(), logger: testLogger("carla"))
        try await syncAll([office, ben, carla])
        #expect(await eventually { ben.roster().isActive(ben.deviceID) && carla.roster().isActive(carla.deviceID) })
        #expect(await eventually { office.roster().activeDevices.count == 3 })

        // Epoch 0, sealed to the three; each opens the same key.
        #expect(try await office.rotateDataKey() == 0)
        let first = try #require(office.currentDataKey())
        #expect(await eventually { ben.currentDataKey() == first && carla.currentDataKey() == first })
        #expect(try await office.deliverDataKeys() == 0)  // everyone has it

        // Carla's phone is lost: removed, and epoch 1 begins without her.
        await carla.stopSync()
        try await office.removeDevice(carla.deviceID)
        let second = try #require(office.currentDataKey())
        #expect(second.epoch == 1 && second != first)
        #expect(await eventually { ben.currentDataKey() == second })
        // Even holding every envelope (all of the office's `_keys` records), Carla opens none of epoch 1.
        let envelopes = Replica.envelopes(in: office.state).filter { $0.epoch == 1 }
        #expect(envelopes.count == 2)
        for envelope in envelopes {
            #expect(throws: SealError.self) { try envelope.open(with: carla.deviceKey, group: carla.groupID) }
        }
        // What Ben writes now is sealed with epoch 1's key: Carla's keys do not open it.
        let blob = try SealedBlob.seal(Array("after the removal".utf8), group: ben.groupID, key: second, writer: ben.deviceKey,
                                       replica: ben.replicaID, counters: 1...1, head: 1)
        for key in carla.dataKeys() { #expect(throws: SealError.self) { try blob.open(with: key, group: carla.groupID) } }
        #expect(try blob.open(with: try #require(ben.currentDataKey()), group: ben.groupID) == Array("after the removal".utf8))
        // Members cannot start an epoch.
        await #expect(throws: ReplicaError.self) { try await ben.rotateDataKey() }
        for replica in [office, ben, carla] { await replica.close() }
    }
}
