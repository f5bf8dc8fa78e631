@_spi(Engine) import PeerSyncCRDT

/// Signing and checking compaction reports (docs/PROTOCOL.md §19, docs/SECURITY.md): a report
/// counts only if the device that claims its replica signed it.
extension SeenReport {
    /// A report of `replica` (an incarnation of the device of `key`) having seen `context`,
    /// signed at `time` (ms since 1970; the caller keeps it above its previous report's).
    package static func signed(by key: DeviceKey, group: GroupID, replica: ReplicaID, time: UInt64, context: CausalContext) -> SeenReport {
        let device = key.deviceID.bytes
        let body = body(groupID: group.bytes, device: device, replica: replica, time: time, context: context)
        return SeenReport(groupID: group.bytes, device: device, replica: replica, time: time, context: context,
                          signature: key.signature(for: signingDomain + body))
    }

    /// What a receiver makes of a report, by its roster.
    package enum Verdict: Sendable, Equatable, CustomStringConvertible {
        /// Signed by the active device that claims its replica: it counts.
        case valid
        /// Its device or its replica's claim is not in this roster yet (they may be on their
        /// way): not an offence; the receiver holds it and judges it again when its roster
        /// changes (the sender does not offer it again).
        case notYetKnown(String)
        /// Signed by a device that was removed: removed devices' reports stop counting.
        case removedDevice
        /// A forgery or a hostile relay's invention: another group, a signature that does not
        /// verify, or a device reporting for a replica that another device claims. The session
        /// that brought it is closed (reason 15).
        case forged(String)

        public var description: String {
            switch self {
            case .valid: "valid"
            case .notYetKnown(let why): "not yet known: \(why)"
            case .removedDevice: "its device was removed"
            case .forged(let why): "forged: \(why)"
            }
        }
    }

    /// Checks the report against `roster`: the group, the signature by the named device's key,
    /// and that the device claims the replica (``Roster/claimant(of:)``).
    package func verdict(in roster: Roster) -> Verdict {
        guard groupID == roster.groupID.bytes else { return .forged("it is for another group") }
        guard let deviceID = DeviceID(bytes: device) else { return .forged("malformed device ID") }
        guard let entry = roster.devices[deviceID] else {
            return .notYetKnown("device \(deviceID.shortForm) is not in the roster")
        }
        guard entry.publicKey.isValidSignature(signature, for: Self.signingDomain + body) else {
            return .forged("the signature of device \(deviceID.shortForm) does not verify")
        }
        if roster.isRemoved(deviceID) { return .removedDevice }
        guard let claimant = roster.claimant(of: replica) else {
            return .notYetKnown("no device claims replica \(replica.shortDescription) yet")
        }
        guard claimant == deviceID else {
            return .forged("device \(deviceID.shortForm) reports for replica \(replica.shortDescription), which \(claimant.shortForm) claims")
        }
        return .valid
    }
}
