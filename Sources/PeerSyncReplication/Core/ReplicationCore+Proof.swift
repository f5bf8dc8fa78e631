@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncWire

/// This device's proof of admission (``Roster/admissionProof(of:)``), cached per roster, and the
/// devices that refused it as unknown: the next session with one of those carries the proof
/// whatever its hello says.
struct MemberProof {
    /// The roster's entry count when ``entries`` was computed (the roster is add-only).
    var computedAt: Int?
    var entries: [RosterEntry]?
    /// Devices that closed a session with "not admitted" although this side took them for members.
    var owedTo: Set<DeviceID> = []
}

/// A member presents its proof of admission to a peer that may lack it (PROTOCOL.md §6.4).
extension ReplicationCore {
    /// The roster entries to send a member peer whose hello is `hello` before any data, or nil:
    /// this device's proof of admission, when the peer may lack some of it — the hello's context
    /// lacks the dot of one of its records here; or the peer knows fewer of its own writes than
    /// this side does (restored in place: its dots may be reused, so its context cannot be
    /// trusted); or the device refused this side as unknown before. The group's creator needs
    /// none (every store of its group holds the genesis).
    mutating func proofOfAdmission(for hello: Hello, device: DeviceID, state: some ReplicaView) -> [RosterEntry]? {
        if proof.computedAt != roster.entries.count {
            proof.entries = roster.admissionProof(of: settings.identity.key.deviceID)
            proof.computedAt = roster.entries.count
        }
        guard let entries = proof.entries, entries.count > 1 || entries.first?.kind != .genesis else { return nil }
        if proof.owedTo.remove(device) != nil { return entries }
        if state.context.maxCounter(of: hello.replicaID) > hello.context.maxCounter(of: hello.replicaID) { return entries }
        let lacking = entries.contains { entry in
            guard let dot = state.records.record(entry.recordKey)?.fields[RosterEntry.field]?.dot else { return true }
            return !hello.context.contains(dot)
        }
        return lacking ? entries : nil
    }

    /// The peer of session `id` closed it as "not admitted". If this side took it for a member,
    /// it does not know this device (or not yet): the next session with it carries the proof.
    mutating func peerRefusedUs(_ id: SessionID) {
        guard let session = sessions[id], session.phase == .established, settings.identity.pendingJoin == nil,
              let device = session.peerKey?.deviceID, roster.isActive(device), proof.owedTo.count < 4_096 else { return }
        proof.owedTo.insert(device)
    }
}

extension ReplicaState {
    /// Stores the roster entries that admit `device` (those not held yet) as one local change.
    /// If `signer` is an active admin and the device's admission rests on an enrol with no add
    /// of its key, it also signs the **confirmation** (an add of the same key, name and role;
    /// ``Roster/confirmation(of:by:)``), dated after the admitting entry, so it has no effect
    /// here but proves the admission to peers that lack the enrol. Returns the delta, or nil if
    /// nothing was written. The caller checked that no entry is dated past the clock-skew bound.
    package mutating func storeAdmission(_ entries: [RosterEntry], of device: DeviceID, signer: LocalIdentity,
                                 maxSkewMilliseconds: UInt64) throws -> RecordMap? {
        var delta = RecordMap.empty()
        var wrote = false
        for entry in entries where !contains(entry.recordKey) {
            delta.merge(write(entry.fields, to: entry.recordKey))
            wrote = true
        }
        let current = roster(of: signer.groupID)
        if let payload = current.confirmation(of: device, by: signer.key.deviceID),
           let add = try confirm(payload, in: current, signer: signer, maxSkewMilliseconds: maxSkewMilliseconds) {
            delta.merge(write(add.fields, to: add.recordKey))
            wrote = true
        }
        return wrote ? delta : nil
    }

    /// Signs and stores the confirmations `signer` owes (``Roster/confirmationsDue(by:heardFrom:)``)
    /// as one local change; nil if none is due.
    mutating func confirmAdmissions(signer: LocalIdentity, heardFrom: Set<DeviceID>, maxSkewMilliseconds: UInt64) throws -> RecordMap? {
        var current = roster(of: signer.groupID)
        var delta = RecordMap.empty()
        var wrote = false
        for payload in current.confirmationsDue(by: signer.key.deviceID, heardFrom: heardFrom) {
            guard let add = try confirm(payload, in: current, signer: signer, maxSkewMilliseconds: maxSkewMilliseconds) else { continue }
            delta.merge(write(add.fields, to: add.recordKey))
            current = current.adding([add])
            wrote = true
        }
        return wrote ? delta : nil
    }

    /// The confirmation `payload` signed by `signer`, dated after the entry that admitted its
    /// device (the clock observes that entry's timestamp first); nil if that entry is dated more
    /// than the clock-skew bound ahead of the wall clock (observing it would drag this replica's
    /// clock, and every timestamp it issues, into the future).
    private mutating func confirm(_ payload: RosterPayload, in roster: Roster, signer: LocalIdentity,
                                  maxSkewMilliseconds: UInt64) throws -> RosterEntry? {
        guard case .add(let key, _, _) = payload, let device = roster.devices[key.deviceID],
              let admitting = roster.entries[device.addedByEntry] else { return nil }
        guard admitting.timestamp.physicalMilliseconds <= clock.physicalNow &+ maxSkewMilliseconds else { return nil }
        observe(admitting.timestamp)
        return try RosterEntry.make(payload, context: roster.context(for: signer.key.deviceID, at: nextTimestamp()), signer: signer.key)
    }
}
