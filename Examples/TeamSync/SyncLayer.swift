import Foundation
import PeerSync

/// The whole sync layer of a shift-planning app (issue 31): a team join that keeps the data a
/// device had alone, sync on and off, a live list of this week's shifts, conflicts, removing
/// a lost device, and a photo on a place. The app's records (`Shift`, `Place`) and two devices
/// driving it are in main.swift; CI checks this file stays within 50 lines.
actor SyncLayer {
    private(set) var replica: Replica
    private let path: String
    init(path: String, name: String) throws { self.path = path; replica = try Replica.open(at: path, name: name) }

    func invite() async throws -> String { try await replica.invite().text }
    func join(_ code: String, keepingMyData: Bool = true) async throws {
        let name = replica.state.name
        await replica.close()
        replica = try Replica.join(at: path, name: name, invite: try InviteCode(parsing: code), keepingData: keepingMyData)
    }
    func setSync(_ on: Bool, peer: UInt16? = nil) async throws -> UInt16 {
        guard on else { await replica.stopSync(); return 0 }
        return try await replica.startSync(SyncConfiguration(security: .tls, listen: .loopback(0), peers: peer.map { [.loopback($0)] } ?? []))
    }
    nonisolated func thisWeek(_ replica: Replica) -> ReplicaObservation<[Shift]> {
        replica.observe(RecordQuery(Shift.self, sortedBy: [KeyPathComparator(\Shift.start)])
            .during({ Calendar.current.dateInterval(of: .weekOfYear, for: $0)! }, at: \.start))
    }
    func assign(_ shift: Shift.ID, to person: String) async throws { try await replica.update(Shift.self, id: shift) { $0.assignee = person } }
    func conflictLines() throws -> [String] {
        try replica.conflicts(includingResolved: false).map {
            "\($0.field): \($0.loser.writerName ?? "someone")'s \((try? $0.loser.value(as: String.self)) ?? "?") lost to "
                + "\($0.winner.writerName ?? "someone")'s \((try? $0.winner.value(as: String.self)) ?? "?")"
        }
    }
    func removeLostDevice(named name: String) async throws {
        guard let device = replica.roster().activeDevices.first(where: { $0.name == name }) else { return }
        try await replica.removeDevice(device.id)
    }
    func setPhoto(_ jpeg: Data, of place: Place.ID) async throws {
        let photo = try await replica.addAttachment(jpeg, mediaType: "image/jpeg")
        try await replica.update(Place.self, id: place) { $0.photo = photo }
    }
    func close() async { await replica.close() }
}
