@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncReplication
import PeerSyncNetwork
import PeerSyncStore

/// Sync bundles: a replica's changes carried on a file between devices that never meet.
extension Replica {
    /// A sync bundle: what a device with context `peerContext` lacks (everything for nil),
    /// encrypted for `recipients` (the context's device, or every active device of the roster
    /// for nil) and signed by this device. Carry it on a USB stick or by mail;
    /// ``applyBundle(_:)`` on the other device.
    ///
    /// - Throws: ``BundleError/notJoined`` for everyone (nil) before this device's join completed:
    ///   it knows no member's key yet.
    package nonisolated func makeBundle(for peer: BundleContext?) throws(BundleError) -> [UInt8] {
        let state = store.state
        let delta = peer.map { state.delta(missingFrom: $0.context) } ?? state.records
        let members = roster().activeDevices.map(\.publicKey)
        if peer == nil, !members.contains(deviceKey.publicKey) { throw .notJoined }
        let recipients = peer.map { [$0.device] } ?? members
        let header = SyncBundle.Header(groupID: groupID, sender: deviceKey.publicKey, senderReplica: replicaID,
                                       senderName: state.name, createdAt: HybridLogicalClock.wallClock(),
                                       records: UInt64(delta.recordCount))
        return SyncBundle.seal(delta, header: header, senderKey: deviceKey, recipients: recipients)
    }

    /// This replica's context as a file signed by this device, for ``makeBundle(for:)`` elsewhere.
    public nonisolated func bundleContext() -> [UInt8] {
        SyncBundle.sealContext(store.state.context, replica: replicaID, groupID: groupID, key: deviceKey)
    }

    /// Reads a context file made by a device of this group.
    package nonisolated func readBundleContext(_ bytes: [UInt8]) throws(BundleError) -> BundleContext {
        try SyncBundle.openContext(bytes, groupID: groupID)
    }

    /// Applies a sync bundle made for this device by an active member, in one transaction, with
    /// the checks a peer's delta passes, and ships what it changed to connected peers. Applying
    /// it twice changes nothing.
    ///
    /// - Throws: ``BundleError`` (nothing is applied), or a storage error.
    @discardableResult
    package func applyBundle(_ bytes: [UInt8], maxClockSkew: Duration = .seconds(300))
        async throws -> (header: SyncBundle.Header, outcome: MergeOutcome)
    {
        let roster = self.roster()
        let (header, delta) = try SyncBundle.open(bytes, groupID: groupID, me: deviceKey)
        if let refusal = DeltaAdmission.refusal(of: delta, now: HybridLogicalClock.wallClock(),
                                                maxSkewMilliseconds: UInt64(max(0, maxClockSkew.wholeMilliseconds))) {
            throw BundleError.refused(refusal)
        }
        let validation = roster.validate(delta: delta)
        if let refusal = validation.refused.first { throw BundleError.refused("roster entry: \(refusal)") }
        // The sender must be a member — counting the roster entries it brings (a joiner's bundle
        // carries its enrol) — or, while this device joins, its inviter.
        let sender = header.sender.deviceID
        guard validation.roster.isActive(sender) || sender == pendingJoin?.inviter else {
            throw BundleError.unknownSender(sender.shortForm)
        }
        if let replica = delta.unclaimedReplica(roster: validation.roster, known: store.state.context) {
            throw BundleError.refused("it holds writes by replica \(replica.shortDescription), which no device of the group claims")
        }
        let admitted = delta.strippingRefused(by: validation.roster)?.delta ?? delta
        // An import: the commit feed tells the app and ships it to peers like any local commit.
        let outcome = try store.applyRemote([admitted], from: "bundle:\(header.sender.deviceID.shortForm)",
                                            origins: [.peer(name: header.senderName, replicaID: header.senderReplica)])
        if pendingJoin != nil, self.roster().isActive(deviceID) {
            pendingJoin = nil  // joined through the bundle: the inviter's roster admits this device
            try store.setMembership(GroupMembership(groupID: groupID.bytes))
        }
        return (header, outcome)
    }
}
