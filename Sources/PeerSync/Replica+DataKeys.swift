import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncSeal
import PeerSyncStore

// The group's data keys by epoch (issue 33; PROTOCOL §20.2): what relays will need. A key
// envelope is a record of the reserved collection `_keys` (record ID: the first 16 bytes of
// SHA-256 of the envelope; one field `e`, its bytes): add-only data that travels like any other
// between devices that meet, sealed to its one recipient.
extension Replica {
    static let keyCollection = "_keys"

    /// The data keys this device can open: from envelopes addressed to it whose sender is an
    /// active admin of the roster now (a removed admin's envelopes do not count: it could start
    /// an epoch whose key it knows).
    package nonisolated func dataKeys() -> [DataKey] {
        let state = self.state
        let roster = state.roster(of: groupID)
        let key = deviceKey
        let group = groupID
        // A device joining through a relay knows its inviter's key before its roster does
        // (the relay gave it; its ID is the invite's): until the roster names the inviter, the
        // inviter's envelopes count — the roster it needs is sealed with their key.
        let inviter: DevicePublicKey? = if case .bytes(let raw)? = state.localSettings[Self.joinInviterKeySetting] {
            DevicePublicKey(x963: raw)
        } else {
            nil
        }
        return Self.envelopes(in: state).compactMap { envelope in
            guard envelope.recipient == key.deviceID else { return nil }
            if roster.role(of: envelope.sender) == .admin, let sender = roster.devices[envelope.sender], envelope.isSigned(by: sender.publicKey) {
                return try? envelope.open(with: key, group: group)
            }
            if roster.devices[envelope.sender] == nil, let inviter, inviter.deviceID == envelope.sender, envelope.isSigned(by: inviter) {
                return try? envelope.open(with: key, group: group)
            }
            return nil
        }
    }

    /// The key to seal with now: the newest epoch's (of two keys of one epoch — two admins
    /// started it at once — the one with the lower key ID, on every device alike). Nil until an
    /// admin delivered one to this device.
    package nonisolated func currentDataKey() -> DataKey? {
        // "Comes before" = an older epoch, or the same epoch with a higher key ID.
        dataKeys().max { a, b in a.epoch != b.epoch ? a.epoch < b.epoch : b.id.lexicographicallyPrecedes(a.id) }
    }

    /// Starts a new epoch (admins only): a new data key, sealed to every active device, this
    /// one included; devices that are not active (removed) get none. Returns the epoch.
    @discardableResult
    package func rotateDataKey() async throws(ReplicaError) -> UInt64 {
        try await ReplicaError.wrapping {
            let group = groupID
            let me = deviceKey
            var epoch: UInt64 = 0
            try await commit { state in
                let roster = state.roster(of: group)
                guard roster.role(of: me.deviceID) == .admin else {
                    throw DeviceAdministrationError.notAdmin(role: roster.role(of: me.deviceID)?.description ?? "device still joining")
                }
                epoch = (Self.envelopes(in: state).map(\.epoch).max()).map { $0 + 1 } ?? 0
                let key = DataKey.generate(epoch: epoch)
                return try Self.writeEnvelopes(key, to: roster.activeDevices.map(\.publicKey), group: group, by: me, into: &state)
            }
            return epoch
        }
    }

    /// Delivers the current data key to every active device that has no envelope of its epoch
    /// (a device admitted since it began). Admins only; returns how many envelopes it wrote.
    @discardableResult
    package func deliverDataKeys() async throws(ReplicaError) -> Int {
        guard let key = currentDataKey() else { return 0 }
        return try await ReplicaError.wrapping {
            let group = groupID
            let me = deviceKey
            var written = 0
            try await commit { state in
                let roster = state.roster(of: group)
                guard roster.role(of: me.deviceID) == .admin else {
                    throw DeviceAdministrationError.notAdmin(role: roster.role(of: me.deviceID)?.description ?? "device still joining")
                }
                let served = Set(Self.envelopes(in: state).filter { $0.epoch == key.epoch }.map(\.recipient))
                let missing = roster.activeDevices.filter { !served.contains($0.id) }.map(\.publicKey)
                written = missing.count
                guard !missing.isEmpty else { return nil }
                return try Self.writeEnvelopes(key, to: missing, group: group, by: me, into: &state)
            }
            return written
        }
    }

    /// Local settings under this prefix keep the data keys this device has opened, so blobs
    /// sealed under an epoch whose admin was removed since still open here (the envelopes stop
    /// counting then). Only for opening: sealing uses keys from active admins' envelopes.
    static let dataKeyCachePrefix = "peersync.data-key."

    /// Data keys this device opened before (``cacheDataKeys()``).
    package nonisolated func cachedDataKeys() -> [DataKey] {
        state.localSettings.compactMap { name, value -> DataKey? in
            guard name.hasPrefix(Self.dataKeyCachePrefix), case .bytes(let raw) = value, raw.count == 40 else { return nil }
            let epoch = raw.prefix(8).reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
            return DataKey(epoch: epoch, bytes: Array(raw.suffix(32)))
        }
    }

    /// Keeps every data key this device can open now among its local settings (never synced).
    package func cacheDataKeys() async throws {
        let cached = Set(cachedDataKeys().map(\.id))
        let new = dataKeys().filter { !cached.contains($0.id) }
        guard !new.isEmpty else { return }
        try await commit { state in
            for key in new {
                let epoch = (0..<8).reversed().map { UInt8(truncatingIfNeeded: key.epoch >> (UInt64($0) * 8)) }
                let name = Self.dataKeyCachePrefix + key.id.map { String(format: "%02x", $0) }.joined()
                _ = state.setSetting(name, to: .bytes(epoch + key.bytes), scope: .local)
            }
            return nil
        }
    }

    /// The local setting holding the inviter's key while this device joins through a relay.
    static let joinInviterKeySetting = "peersync.relay-join-inviter-key"

    /// Remembers the inviter's key a relay gave (its device ID checked against the invite's).
    package func rememberInviterKey(_ key: DevicePublicKey) async throws {
        try await commit { state in
            _ = state.setSetting(Self.joinInviterKeySetting, to: .bytes(key.x963), scope: .local)
            return nil
        }
    }

    /// Local settings under this prefix hold envelopes a relay delivered.
    static let relayEnvelopePrefix = "peersync.relay-envelope."

    /// Keeps envelopes a relay delivered (outside the sealed blobs: a device needs its key to
    /// open them) among this device's local settings — not as records: they are the admin's to
    /// replicate, and a copy written here would be a write of this device's that its peers lack.
    /// Returns how many were new.
    @discardableResult
    package func storeKeyEnvelopes(_ envelopes: [KeyEnvelope]) async throws -> Int {
        let held = Set(Self.envelopes(in: state).map(\.bytes))
        let group = groupID
        let new = envelopes.filter { $0.groupID == group && !held.contains($0.bytes) }
        guard !new.isEmpty else { return 0 }
        try await commit { state in
            for envelope in new {
                _ = state.setSetting(Self.relayEnvelopePrefix + envelope.recordID.uuidString, to: .bytes(envelope.bytes), scope: .local)
            }
            return nil
        }
        return new.count
    }

    /// Every well-formed envelope of the group in `state`.
    static func envelopes(in state: ReplicaState) -> [KeyEnvelope] {
        let replicated = state.records.records(in: keyCollection).compactMap { _, record -> KeyEnvelope? in
            guard record.isVisible, case .bytes(let bytes)? = record.fields["e"]?.value else { return nil }
            return try? KeyEnvelope(bytes: bytes)
        }
        let delivered = state.localSettings.compactMap { key, value -> KeyEnvelope? in
            guard key.hasPrefix(relayEnvelopePrefix), case .bytes(let bytes) = value else { return nil }
            return try? KeyEnvelope(bytes: bytes)
        }
        return replicated + delivered
    }

    /// Writes envelopes of `key` to `recipients` as `_keys` records; returns the joined delta.
    private static func writeEnvelopes(_ key: DataKey, to recipients: [DevicePublicKey], group: GroupID, by sender: DeviceKey,
                                       into state: inout ReplicaState) throws -> RecordMap? {
        var delta: RecordMap?
        for recipient in recipients {
            let envelope = try KeyEnvelope.seal(key, group: group, to: recipient, by: sender)
            let change = state.write(["e": .bytes(envelope.bytes)], to: RecordKey(collection: keyCollection, id: envelope.recordID))
            if delta == nil { delta = change } else { delta!.merge(change) }
        }
        return delta
    }
}
