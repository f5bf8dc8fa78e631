import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncNetwork
import PeerSyncRelay
import PeerSyncReplication
import PeerSyncSeal
import PeerSyncStore
import PeerSyncWire

// A device's side of relays (issue 33, docs/RELAY.md): enrolling one, sealing what the relay
// lacks, opening and admitting what it sends. The session itself is ``RelayLink``'s.
extension Replica {
    /// The member list a relay should hold for this group now: active devices and relays by
    /// key and role, no names (PROTOCOL §20.3).
    package nonisolated func relayMemberList() -> [DevicePublicKey: DeviceRole] {
        let roster = self.roster()
        var members: [DevicePublicKey: DeviceRole] = [:]
        for device in roster.activeDevices { members[device.publicKey] = device.role }
        for relay in roster.relays { members[relay.publicKey] = .relay }
        return members
    }

    /// Enrols the relay whose operator gave `code` (`PSL-…`, printed by `peersync relay`),
    /// reachable at `address`, in this group (admins only): the relay's key joins the roster as
    /// a relay (signed like any entry, so every device learns it), the group gets a data key if
    /// it has none, and the relay takes the group's member list. Devices then reach it when
    /// their ``SyncConfiguration/relays`` name it. Returns the relay's device ID (human form).
    @discardableResult
    public func enrolRelay(at address: PeerAddress, code: String) async throws(ReplicaError) -> String {
        try await ReplicaError.wrapping(otherwise: ReplicaError.relay) {
            let code = try RelayCode(parsing: code)
            guard roster().role(of: deviceID) == .admin else {
                throw DeviceAdministrationError.notAdmin(role: roster().role(of: deviceID)?.description ?? "device still joining")
            }
            let key = deviceKey
            let group = groupID
            do {
                try await RelayDial.run(address, key: key, expecting: code.relay) { relayKey, reader, writer in
                    if roster().role(of: relayKey.deviceID) != .relay {
                        try await writeRosterEntry(adminOnly: true) { _, context, _ in
                            try RosterEntry.make(.add(device: relayKey, name: "relay \(address)", role: .relay), context: context, signer: key)
                        }
                    }
                    if currentDataKey() == nil { try await rotateDataKey() }
                    let members = RelayMembers.sign(group: group, sequence: HybridLogicalClock.wallClock(), members: relayMemberList(), by: key)
                    try await writer.write(RelayMessage.hello(group: group, members: members, enrolSecret: code.secret).frame)
                    let answer = try await Self.nextMessage(&reader)
                    switch answer {
                    case .welcome: writer.close()
                    case .refused(let reason, let text): throw ReplicaError.relay("the relay at \(address) refused: \(reason): \(text)")
                    default: throw ReplicaError.relay("the relay at \(address) answered \(answer.kind) to hello")
                    }
                }
            } catch let error as ReplicaError {
                throw error
            } catch {
                throw ReplicaError.relay("cannot reach the relay at \(address) as the device its code names (\(code.relay.shortForm)): \(error)")
            }
            logger.info("relay enrolled", metadata: ["relay": "\(code.relay.shortForm)", "relay.address": "\(address)"])
            return code.relay.humanForm
        }
    }

    /// The first message of the relay's answer to a hello (the relay sends nothing else until
    /// the device asks); throws at the connection's end.
    nonisolated(nonsending) static func nextMessage(_ reader: inout RelayDial.Reader) async throws -> RelayMessage {
        guard let frames = try await reader.next(), let first = frames.first else {
            throw ReplicaError.relay("the relay closed the connection")
        }
        return try RelayMessage.decode(type: first.type, body: first.body)
    }

    /// The data key a blob names, if this device holds it.
    nonisolated func dataKey(for blob: SealedBlob) -> DataKey? {
        (dataKeys() + cachedDataKeys()).first { $0.epoch == blob.epoch && $0.id == blob.keyID }
    }

    /// Most plaintext bytes one sealed blob carries (a relay frame stays under the frame limit).
    static let relayBlobTarget = 1 << 20

    /// `replica`'s events after `counter`, sealed with the current data key and signed by this
    /// device (at most ``relayBlobTarget`` bytes: a long run is split, the first part returned).
    /// Nil if there is nothing to seal or no data key yet.
    package nonisolated func sealEvents(of replica: ReplicaID, after counter: UInt64) throws -> (blob: SealedBlob, last: UInt64)? {
        guard let key = currentDataKey() else { return nil }
        let records = store.state.records
        guard var (delta, last) = records.events(of: replica, after: counter) else { return nil }
        var plaintext = Self.relayPlaintext(delta)
        // Halve the run until it fits (a first upload of a long history).
        while plaintext.count > Self.relayBlobTarget, last > counter + 1 {
            let through = counter + (last - counter) / 2
            guard let part = records.events(of: replica, after: counter, through: through) else { break }
            (delta, last) = part
            plaintext = Self.relayPlaintext(delta)
        }
        let head = store.state.records.context.contiguousCounter(of: replica)
        let blob = try SealedBlob.seal(plaintext, group: groupID, key: key, writer: deviceKey, replica: replica,
                                       counters: (counter + 1)...last, head: head)
        return (blob, last)
    }

    /// A snapshot of the whole state, sealed: a relay drops every blob it covers.
    package nonisolated func sealSnapshot() throws -> SealedBlob? {
        guard let key = currentDataKey() else { return nil }
        let records = store.state.records
        let own = max(1, records.context.contiguousCounter(of: replicaID))
        return try SealedBlob.seal(Self.relayPlaintext(records), kind: .snapshot, group: groupID, key: key, writer: deviceKey,
                                   replica: replicaID, counters: 1...own, head: own, covers: records.context.versionVector)
    }

    /// A blob's plaintext: varint(base ms) ‖ the delta in the wire encoding, its timestamps
    /// relative to base (PROTOCOL §20.1).
    static func relayPlaintext(_ delta: RecordMap) -> [UInt8] {
        let base = delta.maxTimestamp.physicalMilliseconds
        var out: [UInt8] = []
        Varint.append(base, to: &out)
        out += WireDelta.encode(records: delta.allRecords, context: delta.context, with: WireDictionary(startingAt: base))
        return out
    }

    static func relayDelta(_ plaintext: [UInt8]) throws -> RecordMap {
        var reader = ByteReader(plaintext)
        guard let base = reader.readVarint() else { throw SealError.malformed("sealed blob: plaintext without its base time") }
        return try WireDelta.decode(Array(plaintext[reader.offset...]), with: WireDictionary(startingAt: base))
    }

    /// Opens, checks and applies blobs a relay sent, in order, as one import (the commit feed
    /// tells the app and ships them to directly connected peers). Returns one line per blob
    /// refused — nothing of a refused blob is applied — and the blobs applied.
    package nonisolated func applyRelayBlobs(_ blobs: [SealedBlob], relay: String, maxClockSkew: Duration,
                                             inviter: DevicePublicKey? = nil) throws -> (applied: [SealedBlob], refused: [String]) {
        try recoverIfRestored(seeing: blobs)
        var refused: [String] = []
        var applied: [SealedBlob] = []
        var deltas: [RecordMap] = []
        var origins: [ChangeOrigin] = []
        var roster = self.roster()
        // Blobs whose signer this roster does not know yet wait for the blobs that admit it (a
        // new device learns the roster from these very blobs, in no causal order): passes until
        // one makes no progress.
        var waiting = blobs
        var progress = true
        while progress, !waiting.isEmpty {
            progress = false
            var unknown: [SealedBlob] = []
            for blob in waiting {
                if roster.devices[blob.writer] == nil, blob.writer != inviter?.deviceID {
                    unknown.append(blob)
                    continue
                }
                progress = true
                open(blob)
            }
            waiting = unknown
        }
        for blob in waiting { refused.append("\(SealError.badSignature("signed by \(blob.writer.shortForm), not a device of this group"))") }
        func open(_ blob: SealedBlob) {
            do {
                guard blob.groupID == groupID else { throw SealError.notForThis("a blob of another group") }
                // The signer: any device the roster ever admitted (blobs outlive removals; what a
                // removed device wrote after its cutoff is stripped below, as in sync) — or, for a
                // device still joining, its inviter, by the key the relay gave (its ID checked).
                let signer: (key: DevicePublicKey, name: String)
                if let writer = roster.devices[blob.writer] {
                    guard writer.role.isDevice else { throw SealError.badSignature("signed by \(blob.writer.shortForm), not a device of this group") }
                    signer = (writer.publicKey, writer.name)
                } else if let inviter, inviter.deviceID == blob.writer {
                    signer = (inviter, "the inviter")
                } else {
                    throw SealError.badSignature("signed by \(blob.writer.shortForm), not a device of this group")
                }
                guard blob.isSigned(by: signer.key) else {
                    throw SealError.badSignature("the signature is not \(signer.name)'s (altered, or attributed to another writer)")
                }
                guard let key = dataKey(for: blob) else {
                    throw SealError.cannotOpen("sealed with epoch \(blob.epoch)'s key, which this device does not hold")
                }
                let delta = try Self.relayDelta(try blob.open(with: key, group: groupID))
                if blob.kind == .writes {
                    // The plaintext must be what the header says: only that replica's counters.
                    let expected = CausalContext(dots: (blob.firstCounter...blob.lastCounter).map { Dot(replica: blob.replica, counter: $0) })
                    guard delta.context == expected else { throw SealError.malformed("the blob's events are not the counters its header names") }
                } else {
                    // A snapshot holds at least what its header says it covers (the relay dropped
                    // the blobs it covers on that claim).
                    guard delta.context.includes(CausalContext(versionVector: blob.covers)) else {
                        throw SealError.malformed("the snapshot holds less than the counters its header says it covers")
                    }
                }
                if let refusal = DeltaAdmission.refusal(of: delta, now: HybridLogicalClock.wallClock(),
                                                        maxSkewMilliseconds: UInt64(max(0, maxClockSkew.wholeMilliseconds))) {
                    throw SealError.notForThis(refusal)
                }
                let validation = roster.validate(delta: delta)
                if let refusal = validation.refused.first { throw SealError.notForThis("roster entry: \(refusal)") }
                if let replica = delta.unclaimedReplica(roster: validation.roster, known: store.state.context) {
                    throw SealError.notForThis("writes by replica \(replica.shortDescription), which no device of the group claims")
                }
                roster = validation.roster
                deltas.append(delta.strippingRefused(by: validation.roster)?.delta ?? delta)
                origins.append(.peer(name: relay, replicaID: blob.replica))
                applied.append(blob)
            } catch {
                refused.append("\(error)")
            }
        }
        if !deltas.isEmpty {
            _ = try store.applyRemote(deltas, from: "relay:\(relay)", origins: origins)
            scheduleCompaction()  // as after any commit: deletions may have become stable
        }
        return (applied, refused)
    }
}

extension Replica {
    /// The relays this device dials (``SyncConfiguration/relays``) and how each is doing: in
    /// `peersync status` and ``SyncHealth``.
    public func relayStatus() async -> [RelayStatus] {
        var statuses: [RelayStatus] = []
        for link in relayLinks { statuses.append(await link.status) }
        return statuses
    }

    /// Asks every relay session to upload a snapshot of the whole state, so the relays drop
    /// every blob it covers (after compaction, their storage follows the live data).
    public func uploadRelaySnapshot() async {
        for link in relayLinks { await link.snapshotRequested() }
    }

    func startRelays(_ configuration: SyncConfiguration) {
        for address in configuration.relays {
            let link = RelayLink(replica: self, address: address, timing: configuration.timing,
                                 rejectedBackoff: configuration.limits.rejectedDialBackoff, logger: logger)
            relayLinks.append(link)
            relayTasks.append(Task { await link.run() })
        }
    }

    func stopRelays() async {
        for task in relayTasks { task.cancel() }
        for task in relayTasks { await task.value }
        relayTasks = []
        relayLinks = []
    }
}

// A store put back from an older copy meets its lost future at the relay (PROTOCOL §20.5).
extension Replica {
    /// Blobs of this store's own replica ID with counters beyond any it holds mean it was put
    /// back from an older copy (in place, so opening did not see it) and a lost future of it
    /// wrote on: applying them would give two events one dot. As when a peer's hello shows it
    /// (§6.9), the store continues as a new incarnation, and the writes it made since the restore
    /// — after the newest of its lost future's writes, read from these very blobs — move to it.
    /// Returns whether it recovered (sync must restart under the new replica ID).
    @discardableResult
    package nonisolated func recoverIfRestored(seeing blobs: [SealedBlob]) throws -> Bool {
        let own = store.replicaID
        let issued = store.state.context.maxCounter(of: own)
        let future = blobs.filter { $0.kind == .writes && $0.replica == own && $0.writer == deviceID && $0.lastCounter > issued }
        guard !future.isEmpty else { return false }
        let lostSince = future.compactMap { blob -> UInt64? in
            guard blob.isSigned(by: deviceKey.publicKey), let key = dataKey(for: blob),
                  let plaintext = try? blob.open(with: key, group: groupID), let delta = try? Self.relayDelta(plaintext) else { return nil }
            return delta.maxTimestamp.physicalMilliseconds
        }.max()
        let known = future.map(\.lastCounter).max() ?? issued
        let recovery = try Self.recoverFromRestore(
            store, key: deviceKey, groupID: groupID, lostReplica: own, lostSince: lostSince,
            reason: "the relay holds \(known) writes by this replica, the store has \(issued): it was restored from an older copy")
        logger.warning("this store was restored from an older copy; continuing as a new replica", metadata: [
            "replica.id": "\(store.replicaID.shortDescription)", "replica.previous": "\(own.shortDescription)",
            "restore.moved": "\(recovery.moved)",
        ])
        Task { await self.resumeSyncAfterRestore() }
        return true
    }

    /// Starts sync again under the replica ID a recovery from a restore gave (sessions and relay
    /// links announced or uploaded under the old one).
    func resumeSyncAfterRestore() async {
        guard let configuration else { return }
        _ = try? await startSync(configuration)
    }
}

// Joining through a relay (PROTOCOL §20.6): the joiner's enrol reaches its inviter sealed; the
// inviter admits it as it would in a direct session; the relay welcomes the joiner once the
// member list names it.
extension Replica {
    /// Admits the device whose join request a relay carried (the inviter's device): the same
    /// checks as a direct join — its enrol entry, signed by it, with an open invite's token —
    /// then the admission and an admin's confirmation are written. Returns the joiner's name.
    package func admitThroughRelay(_ request: JoinRequest, maxClockSkew: Duration) async throws -> String {
        let entry = try RosterEntry(bytes: try request.open(with: deviceKey))
        guard case .enrol(let token, let name) = entry.payload, entry.signer == request.joiner, entry.groupID == groupID else {
            throw ReplicaError.relay("a join request whose entry is not the joiner's own enrol in this group")
        }
        let now = HybridLogicalClock.wallClock()
        let skew = UInt64(max(0, maxClockSkew.wholeMilliseconds))
        guard entry.timestamp.physicalMilliseconds <= now &+ skew else { throw ReplicaError.relay("the join request is dated in the future") }
        let roster = self.roster()
        if roster.isActive(request.joiner) { return name }
        let validation = roster.validate(incoming: [entry])
        if let refusal = validation.refused.first { throw ReplicaError.relay("the join request is refused: \(refusal)") }
        if let refusal = roster.joinRefusal(token: token, now: now) { throw ReplicaError.relay("the join request is refused: \(refusal)") }
        guard validation.roster.isActive(request.joiner) else { throw ReplicaError.relay("the roster does not admit \(name)") }
        let identity = self.identity
        try await commit { state in
            try state.storeAdmission([entry], of: request.joiner, signer: identity, maxSkewMilliseconds: skew)
        }
        logger.info("admitted a device through a relay", metadata: ["device": "\(request.joiner.shortForm)", "name": "\(name)"])
        return name
    }

    /// Ends this device's join once the roster it holds admits it (its inviter admitted it
    /// through a relay). Returns whether it did.
    @discardableResult
    package func finishJoinIfAdmitted() throws -> Bool {
        guard pendingJoin != nil, roster().isActive(deviceID) else { return false }
        pendingJoin = nil
        try store.setMembership(GroupMembership(groupID: groupID.bytes))
        _ = try store.write { state in
            _ = state.setSetting(Self.joinInviterKeySetting, to: nil, scope: .local)
            return nil
        }
        logger.info("joined the group through a relay")
        return true
    }
}
