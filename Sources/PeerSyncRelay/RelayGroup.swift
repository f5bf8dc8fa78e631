@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncReplication
import PeerSyncSeal

/// One group as a relay holds it, and the relay's decisions about it — pure: what to store,
/// what to drop, what a device lacks, who may connect (docs/PROTOCOL.md §20.4). The service
/// carries the decisions out (storage, sockets).
package struct RelayGroup: Sendable {
    public private(set) var members: RelayMembers
    /// Writes blobs by replica, in ascending first counter.
    private(set) var writes: [ReplicaID: [StoredBlobInfo]] = [:]
    /// The newest snapshot, if any.
    private(set) var snapshot: StoredBlobInfo?
    /// Per replica, the counters the snapshot and writes cover from 1 without a gap.
    public private(set) var covered: [ReplicaID: UInt64] = [:]
    public private(set) var blobCount = 0
    public private(set) var byteCount = 0
    /// Key envelopes by recipient.
    public private(set) var envelopes: [DeviceID: Set<[UInt8]>] = [:]

    /// The newest compaction report of each replica, by the device that signed it (a member
    /// that signs a report for another's replica displaces nothing: devices refuse it, and the
    /// genuine one stays).
    public private(set) var reports: [[UInt8]: SeenReport] = [:]

    static func reportKey(_ report: SeenReport) -> [UInt8] { report.device + report.replica.bigEndianBytes }

    package init(members: RelayMembers, blobs: [StoredBlobInfo] = [], envelopes: [KeyEnvelope] = [], reports: [SeenReport] = []) {
        self.members = members
        for report in reports { self.reports[Self.reportKey(report)] = report }
        for blob in blobs { add(blob) }
        for envelope in envelopes { insertEnvelope(envelope) }
    }

    private mutating func insertEnvelope(_ envelope: KeyEnvelope) {
        envelopes[envelope.recipient, default: []].insert(envelope.bytes)
    }

    /// The envelopes of `offered` to keep: new ones of this group, signed by an admin of the
    /// member list, addressed to a member.
    package func newEnvelopes(_ offered: [KeyEnvelope]) -> [KeyEnvelope] {
        offered.filter { envelope in
            guard envelope.groupID == members.groupID, !(envelopes[envelope.recipient]?.contains(envelope.bytes) ?? false),
                  let (key, role) = members.member(envelope.sender), role == .admin, envelope.isSigned(by: key) else { return false }
            return admits(envelope.recipient)
        }
    }

    package mutating func stored(envelopes new: [KeyEnvelope]) {
        for envelope in new { insertEnvelope(envelope) }
    }

    /// The reports of `offered` newer than those held, signed by the member they name.
    package func newReports(_ offered: [SeenReport]) -> [SeenReport] {
        var newest: [[UInt8]: SeenReport] = [:]
        for report in offered where report.groupID == members.groupID.bytes {
            let slot = Self.reportKey(report)
            // Bounded: a few replicas per member (incarnations after restores), no more.
            guard reports[slot] != nil || newest[slot] != nil || reports.count + newest.count < members.members.count * 8 else { continue }
            guard report.time > max(reports[slot]?.time ?? 0, newest[slot]?.time ?? 0),
                  let device = DeviceID(bytes: report.device), let (key, _) = members.member(device), admits(device),
                  key.isValidSignature(report.signature, for: SeenReport.signingDomain + report.body) else { continue }
            newest[slot] = report
        }
        return Array(newest.values)
    }

    package mutating func stored(reports new: [SeenReport]) {
        for report in new { reports[Self.reportKey(report)] = report }
    }

    /// Join requests waiting for their inviter, by joiner (in memory: a joiner that is still
    /// waiting sends its request again when it reconnects).
    public private(set) var joinRequests: [DeviceID: JoinRequest] = [:]
    /// Most join requests a group holds at once (the oldest goes).
    static let maxJoinRequests = 64

    /// Whether `joiner` may ask `inviter` to admit it here: the inviter is an admin of the list,
    /// and the joiner is not a member already.
    package func acceptsJoin(of joiner: DeviceID, inviter: DeviceID) -> DevicePublicKey? {
        guard !admits(joiner), let (key, role) = members.member(inviter), role == .admin else { return nil }
        return key
    }

    package mutating func hold(_ request: JoinRequest) {
        if joinRequests.count >= Self.maxJoinRequests, joinRequests[request.joiner] == nil, let any = joinRequests.keys.first {
            joinRequests[any] = nil
        }
        joinRequests[request.joiner] = request
    }

    package mutating func dropJoinRequests(admitted: (DeviceID) -> Bool) {
        joinRequests = joinRequests.filter { !admitted($0.key) }
    }

    /// The envelopes addressed to `device`.
    package func envelopes(for device: DeviceID) -> [KeyEnvelope] {
        (envelopes[device] ?? []).compactMap { try? KeyEnvelope(bytes: $0) }
    }

    /// What to do with an upload.
    package enum UploadDecision: Equatable {
        /// Everything it carries is held already: answer "stored", keep nothing.
        case duplicate
        /// Store it, deleting `dropping` (blobs a snapshot covers).
        case store(dropping: [Int64])
        case refuse(RelayRefusal, String)
    }

    /// Decides on `blob`, uploaded by `device`, under `limits`.
    package func decide(_ blob: SealedBlob, from device: DeviceID, limits: SyncLimits) -> UploadDecision {
        guard blob.groupID == members.groupID else { return .refuse(.malformed, "a blob of another group") }
        // Only members write; the relay cannot read the blob, but it can refuse strangers' and
        // forgeries: the signer must be a member (device or admin) of the list it holds.
        guard let (key, role) = members.member(blob.writer), role == .member || role == .admin else {
            return .refuse(.notMember, "the blob's writer \(blob.writer.shortForm) is not a member of the group")
        }
        guard blob.isSigned(by: key) else { return .refuse(.badSignature, "the blob's signature does not verify with its writer's key") }
        var dropping: [Int64] = []
        switch blob.kind {
        case .writes:
            if blob.lastCounter <= covered[blob.replica, default: 0] { return .duplicate }
        case .snapshot:
            if let snapshot, !Self.includes(blob.covers, snapshot.covers) {
                return .refuse(.other, "the snapshot covers less than the one held")
            }
            if let snapshot { dropping.append(snapshot.id) }
            for (replica, blobs) in writes {
                let limit = blob.covers[replica, default: 0]
                dropping += blobs.filter { $0.last <= limit }.map(\.id)
            }
        }
        let freed = dropping.reduce(0) { total, id in total + (size(of: id) ?? 0) }
        if byteCount - freed + blob.size > limits.relayGroupBytes {
            return .refuse(.overBytes, "the group holds \(byteCount) bytes at this relay; \(blob.size) more would pass its quota of \(limits.relayGroupBytes)")
        }
        if blobCount - dropping.count + 1 > limits.relayGroupBlobs {
            return .refuse(.overBlobs, "the group holds \(blobCount) blobs at this relay, its quota")
        }
        return .store(dropping: dropping)
    }

    private func size(of id: Int64) -> Int? {
        if snapshot?.id == id { return snapshot?.size }
        for blobs in writes.values { if let blob = blobs.first(where: { $0.id == id }) { return blob.size } }
        return nil
    }

    static func includes(_ a: [ReplicaID: UInt64], _ b: [ReplicaID: UInt64]) -> Bool {
        b.allSatisfy { a[$0.key, default: 0] >= $0.value }
    }

    /// Records a stored blob, after dropping `dropped`.
    package mutating func stored(_ blob: StoredBlobInfo, dropping dropped: [Int64] = []) {
        let gone = Set(dropped)
        if let snapshot, gone.contains(snapshot.id) { remove(snapshot); self.snapshot = nil }
        if !gone.isEmpty {
            for (replica, blobs) in writes {
                let keep = blobs.filter { !gone.contains($0.id) }
                for blob in blobs where gone.contains(blob.id) { remove(blob) }
                writes[replica] = keep.isEmpty ? nil : keep
            }
        }
        add(blob)
    }

    private mutating func remove(_ blob: StoredBlobInfo) {
        blobCount -= 1
        byteCount -= blob.size
    }

    private mutating func add(_ blob: StoredBlobInfo) {
        blobCount += 1
        byteCount += blob.size
        switch blob.kind {
        case .snapshot:
            snapshot = blob
            recomputeCovered()
        case .writes:
            var list = writes[blob.replica, default: []]
            let index = list.firstIndex { $0.first > blob.first } ?? list.endIndex
            list.insert(blob, at: index)
            writes[blob.replica] = list
            covered[blob.replica] = Self.coverage(from: snapshot?.covers[blob.replica] ?? 0, list)
        }
    }

    private mutating func recomputeCovered() {
        var result = snapshot?.covers ?? [:]
        for (replica, list) in writes { result[replica] = Self.coverage(from: result[replica] ?? 0, list) }
        covered = result.filter { $0.value > 0 }
    }

    static func coverage(from start: UInt64, _ list: [StoredBlobInfo]) -> UInt64 {
        var covered = start
        for blob in list where blob.first <= covered + 1 { covered = max(covered, blob.last) }
        return covered
    }

    /// The blobs a device holding `have` (contiguous counters per replica) lacks, in the order
    /// to send them: the snapshot first if it covers something the device lacks, then writes
    /// by replica in ascending counters.
    package func plan(for have: [ReplicaID: UInt64]) -> [Int64] {
        var plan: [Int64] = []
        var have = have
        if let snapshot, !Self.includes(have, snapshot.covers) {
            plan.append(snapshot.id)
            for (replica, counter) in snapshot.covers { have[replica] = max(have[replica, default: 0], counter) }
        }
        for (replica, list) in writes.sorted(by: { $0.key.bigEndianBytes.lexicographicallyPrecedes($1.key.bigEndianBytes) }) {
            let held = have[replica, default: 0]
            plan += list.filter { $0.last > held }.map(\.id)
        }
        return plan
    }

    /// What a newer member list means.
    package enum MembersDecision: Equatable {
        case take
        /// Not newer than the list held: nothing changes.
        case stale
        /// The new list no longer names this relay: forget the group.
        case relayRemoved
        case refuse(RelayRefusal, String)
    }

    /// Decides on `newer`, a member list offered for this group, for the relay `relay`.
    package func decide(members newer: RelayMembers, relay: DeviceID) -> MembersDecision {
        guard newer.groupID == members.groupID else { return .refuse(.malformed, "a member list of another group") }
        guard newer.sequence > members.sequence else { return .stale }
        guard let (key, role) = members.member(newer.signer), role == .admin else {
            return .refuse(.notMember, "the member list is signed by \(newer.signer.shortForm), not an admin of the list held (\(members.sequence))")
        }
        guard newer.isSigned(by: key) else { return .refuse(.badSignature, "the member list's signature does not verify") }
        guard newer.member(relay)?.role == .relay else { return .relayRemoved }
        return .take
    }

    package mutating func take(_ newer: RelayMembers) { members = newer }

    /// Whether `device` may hold a session for this group (a member or admin of the list).
    package func admits(_ device: DeviceID) -> Bool {
        guard let role = members.member(device)?.role else { return false }
        return role == .member || role == .admin
    }
}
