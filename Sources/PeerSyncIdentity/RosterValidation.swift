@_spi(Engine) import PeerSyncCRDT

/// What to do with roster entries received from a peer, decided before anything is stored.
///
/// Refusals are of two kinds:
/// - ``Refusal/Kind/malformed``: the bytes can never be a valid entry of this group (bad
///   encoding or signature, altered record, another group's entry, a deletion of a roster
///   record). The peer sent something no honest replica sends.
/// - ``Refusal/Kind/notYet``: the entry is well formed but nothing known so far lets its signer
///   make it: an unknown signer, a signer that no entry ever made an admin, an enrol without a
///   matching unexpired invite. It may become acceptable once more entries arrive (the peer will
///   offer it again), so this is not a sign of a hostile peer.
///
/// Everything else is accepted and stored, even an entry that has no effect in the evaluated
/// roster (e.g. one signed by a device after its removal): such entries are listed in
/// ``noEffect`` for logging. Refusing them instead would make replicas that received entries in
/// different orders hold different sets forever (one accepted an entry before it knew of a
/// removal, the other refuses it after), and they would re-offer it to each other endlessly.
/// The acceptance test only ever gets more permissive as the known entries grow, so replicas
/// that exchange everything converge on the same set, hence the same roster.
package struct RosterValidation: Sendable {
    /// One refused entry or record.
    package struct Refusal: Hashable, Sendable, CustomStringConvertible {
        /// Whether the refusal is final.
        package enum Kind: Hashable, Sendable {
            /// Never acceptable.
            case malformed
            /// Not acceptable with what is known now; may be later.
            case notYet
        }

        /// Final or not yet.
        public let kind: Kind
        /// The record it came in, if known.
        public let recordID: UUID?
        /// The signer, if the entry decoded.
        public let signer: DeviceID?
        /// One line for a person.
        public let reason: String

        public var description: String {
            var subject = recordID.map { "roster record \(RosterEntryID(uuid: $0).shortDescription)" } ?? "roster entry"
            if let signer { subject += " by \(signer.shortForm)" }
            return "\(subject) refused: \(reason)"
        }
    }

    /// Valid entries that were not known yet: store these.
    public internal(set) var accepted: [RosterEntry] = []
    /// Entries that were already known (nothing to do).
    public internal(set) var alreadyKnown = 0
    /// Refused entries or records, with reasons.
    public internal(set) var refused: [Refusal] = []
    /// Accepted entries that do not count in ``roster``, with reasons.
    public internal(set) var noEffect: [Roster.IneffectiveEntry] = []
    /// The roster with the accepted entries.
    public internal(set) var roster: Roster

    /// Whether any refusal is ``Refusal/Kind/malformed``.
    public var hasMalformed: Bool { refused.contains { $0.kind == .malformed } }
}

extension Roster {
    /// Checks entries received from a peer against this roster. Pure: stores nothing.
    package func validate(incoming: [RosterEntry]) -> RosterValidation {
        validate(decoded: incoming.map { (nil, $0) }, refused: [])
    }

    /// Checks `_roster` records received from a peer: decodes each, checks its record ID is the
    /// hash of its bytes, then validates as ``validate(incoming:)``.
    package func validate(records: [(id: UUID, fields: [String: FieldValue])]) -> RosterValidation {
        var decoded: [(UUID?, RosterEntry)] = []
        var refused: [RosterValidation.Refusal] = []
        var known = 0
        for record in records {
            // An entry held already, byte for byte (every catch-up offers the whole roster):
            // nothing to decode or verify — its record ID is the hash of these same bytes.
            if let held = entries[RosterEntryID(uuid: record.id)], record.fields.count == 1,
               case .bytes(let bytes)? = record.fields[RosterEntry.field], bytes == held.bytes {
                known += 1
                continue
            }
            do throws(RosterEntryError) {
                decoded.append((record.id, try RosterEntry(recordID: record.id, fields: record.fields)))
            } catch {
                refused.append(.init(kind: .malformed, recordID: record.id, signer: nil, reason: error.description))
            }
        }
        var result = validate(decoded: decoded, refused: refused)
        result.alreadyKnown += known
        return result
    }

    /// Checks the `_roster` part of a delta (or catch-up chunk): every record there must carry one
    /// valid entry, and none may be deleted (the roster is add-only: a presence entry marked
    /// removed is refused). Records without fields and without deletions carry nothing new and
    /// are skipped.
    package func validate(delta: RecordMap) -> RosterValidation {
        var records: [(id: UUID, fields: [String: FieldValue])] = []
        var refused: [RosterValidation.Refusal] = []
        for (id, state) in delta.records(in: RosterEntry.collection) {
            if state.presence.values.contains(where: { !$0.isLive }) {
                refused.append(.init(kind: .malformed, recordID: id, signer: nil,
                                     reason: "it deletes a roster record (the roster is add-only)"))
                continue
            }
            if state.fields.isEmpty { continue }
            records.append((id, state.values))
        }
        var result = validate(records: records)
        result.refused = refused + result.refused
        return result
    }

    private func validate(decoded: [(UUID?, RosterEntry)], refused initial: [RosterValidation.Refusal]) -> RosterValidation {
        var result = RosterValidation(roster: self)
        result.refused = initial
        var fresh: [(UUID?, RosterEntry)] = []
        var seen: Set<RosterEntryID> = []
        for (recordID, entry) in decoded {
            if entries[entry.id] != nil || !seen.insert(entry.id).inserted {
                result.alreadyKnown += 1
                continue
            }
            if entry.groupID != groupID {
                let reason = entry.kind == .genesis
                    ? "it is the genesis of another group (\(entry.groupID))"
                    : "it belongs to group \(entry.groupID), not \(groupID)"
                result.refused.append(.init(kind: .malformed, recordID: recordID, signer: entry.signer, reason: reason))
                continue
            }
            fresh.append((recordID, entry))
        }

        // What the known and incoming entries prove about keys, admins and invites, counting an
        // entry only once its signer's authority is proven (no entry vouches for itself). Only
        // ever grows with more entries, so a refusal below can only turn into an acceptance later.
        let proof = ProvenAuthority(Array(entries.values) + fresh.map(\.1))
        let (introduced, everAdmin, invitesByHash) = (proof.introduced, proof.everAdmin, proof.invites)

        var accepted: [RosterEntry] = []
        for (recordID, entry) in fresh {
            let signer = entry.signer
            var reason: String?
            switch entry.payload {
            case .genesis, .legacyGenesis, .legacyEnrol:
                break // self-introducing; signature and proof were checked when decoding
            case .enrol:
                reason = ProvenAuthority.enrolRefusal(entry, invites: invitesByHash)
            case .add, .remove, .invite, .revokeInvite, .closeLegacy:
                if !introduced.contains(signer) {
                    reason = "signer \(signer.shortForm) is not a known device"
                } else if !everAdmin.contains(signer) {
                    reason = "\(signer.shortForm) has never been an admin; \(entry.kind) needs an admin"
                }
            case let .rename(target, _):
                if !introduced.contains(signer) {
                    reason = "signer \(signer.shortForm) is not a known device"
                } else if target != signer, !everAdmin.contains(signer) {
                    reason = "\(signer.shortForm) has never been an admin and may rename only itself"
                }
            case .writer:
                if !introduced.contains(signer) { reason = "signer \(signer.shortForm) is not a known device" }
            }
            if let reason {
                result.refused.append(.init(kind: .notYet, recordID: recordID, signer: signer, reason: reason))
            } else {
                accepted.append(entry)
            }
        }
        result.accepted = accepted
        guard !accepted.isEmpty else { return result }
        let updated = adding(accepted)
        let acceptedIDs = Set(accepted.map(\.id))
        result.noEffect = updated.ineffective.filter { acceptedIDs.contains($0.entry.id) }
        result.roster = updated
        return result
    }
}

/// Which devices a set of roster entries proves known ("introduced") and ever an admin, and
/// which invites it proves made by an admin, for ``Roster/validate(incoming:)``.
///
/// Authority is rooted: the genesis and legacyEnrol entries prove themselves (their signature
/// and legacy proof are checked when decoding); an `add` introduces its device, and an admin
/// `add` makes it an admin, only if its signer is proven an admin; an `invite` counts only if
/// its signer is; an enrol introduces its signer only with such an invite, unexpired at the
/// enrol's timestamp (an admin invite makes it an admin). So a member's `add(own key, admin)`,
/// two members promoting each other, or a member's invite used by a key of its own prove
/// nothing, while a chain from the genesis (X adds Y as admin, Y adds Z) arriving in one batch,
/// in any order, proves every link. Time is not looked at (the roster's evaluation does that):
/// this only decides what may be stored.
struct ProvenAuthority {
    typealias Invite = (role: DeviceRole, expiresAt: UInt64)

    let introduced: Set<DeviceID>
    let everAdmin: Set<DeviceID>
    /// Invites signed by a proven admin, by hash.
    let invites: [InviteHash: [Invite]]

    /// Each entry is looked at once, when the device it waits for is proven an admin (an enrol:
    /// again for each proven invite with its hash): O(entries) for honest rosters.
    init(_ entries: [RosterEntry]) {
        var introduced: Set<DeviceID> = []
        var everAdmin: Set<DeviceID> = []
        var invites: [InviteHash: [Invite]] = [:]
        var waitingForAdmin: [DeviceID: [RosterEntry]] = [:]  // adds and invites, by signer
        var waitingForInvite: [InviteHash: [RosterEntry]] = [:]  // enrols, by the hash of their token
        var newAdmins: [DeviceID] = []
        func introduce(_ device: DeviceID, admin: Bool) {
            introduced.insert(device)
            if admin, everAdmin.insert(device).inserted { newAdmins.append(device) }
        }
        for entry in entries {
            switch entry.payload {
            case .genesis, .legacyEnrol: introduce(entry.signer, admin: true)
            case .add, .invite: waitingForAdmin[entry.signer, default: []].append(entry)
            case .enrol(let token, _): waitingForInvite[token.hash, default: []].append(entry)
            default: break
            }
        }
        while let admin = newAdmins.popLast() {
            for entry in waitingForAdmin.removeValue(forKey: admin) ?? [] {
                switch entry.payload {
                case let .add(key, _, role):
                    introduce(key.deviceID, admin: role.signsAsAdmin)  // a recovery key signs as an admin
                case let .invite(hash, role, expiresAt):
                    invites[hash, default: []].append((role, expiresAt))
                    let adminInvite = invites[hash]!.contains { $0.role == .admin }
                    for enrol in waitingForInvite[hash] ?? [] where Self.enrolRefusal(enrol, invites: invites) == nil {
                        introduce(enrol.signer, admin: adminInvite)
                    }
                default:
                    break
                }
            }
        }
        (self.introduced, self.everAdmin, self.invites) = (introduced, everAdmin, invites)
    }

    /// Why `enrol` is not acceptable with `invites` (nil: it is).
    static func enrolRefusal(_ enrol: RosterEntry, invites: [InviteHash: [Invite]]) -> String? {
        guard case .enrol(let token, _) = enrol.payload else { return nil }
        let matching = invites[token.hash] ?? []
        guard let latest = matching.map(\.expiresAt).max() else { return "no invite \(token.hash) is known" }
        if enrol.timestamp.physicalMilliseconds > latest {
            return "invite \(token.hash) expired at \(wallClockText(latest)), before this enrol"
        }
        return nil
    }
}
