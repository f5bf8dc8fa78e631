import Foundation
import Logging
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncNetwork
import PeerSyncRelay
import PeerSyncReplication
import PeerSyncSeal
import PeerSyncStore

/// The device's session with one relay, redialed with backoff while sync runs: hello, an
/// admin's member list, what the device lacks fetched and applied, what the relay lacks sealed
/// and uploaded, live blobs both ways, keepalive and the withholding watch (docs/RELAY.md). The
/// decisions are ``RelayLedger``'s; this actor carries them out.
actor RelayLink {
    let address: PeerAddress
    private let replica: Replica
    private let timing: SyncTiming
    private let logger: Logger
    private var ledger = RelayLedger()
    private(set) var status: RelayStatus
    private var lastHeard = ContinuousClock.now
    private let started = ContinuousClock.now
    private var sentMembers: [DevicePublicKey: DeviceRole]?
    private var heldSequence: UInt64 = 0
    private var quotaPauseUntil: ContinuousClock.Instant?
    private var reported: Set<String> = []
    private var wake: AsyncStream<Void>.Continuation?
    /// This device's own join, while it asks through the relay.
    private var pendingJoin: PendingJoin?
    /// The inviter's key, from the relay (its device ID checked), while this device joins.
    private var inviterKey: DevicePublicKey?
    /// A blob was refused for want of its data key (asked again when keys arrive).
    private var lackedKey = false
    /// The relay has welcomed this session (uploads wait for its vector).
    private var welcomed = false
    /// The last session ended with the relay's refusal (redialed with the longer backoff).
    private var refusedLast = false
    /// Report times given to the relay in this session, by replica.
    private var reportsSent: [ReplicaID: UInt64] = [:]
    /// A relay holding at least this many blobs of the group is sent a snapshot.
    static let snapshotAboveBlobs: UInt64 = 1_000
    /// Envelopes given to the relay in this session.
    private var sentEnvelopes: Set<[UInt8]> = []

    private let rejectedBackoff: Backoff

    init(replica: Replica, address: PeerAddress, timing: SyncTiming, rejectedBackoff: Backoff, logger: Logger) {
        self.rejectedBackoff = rejectedBackoff
        self.replica = replica
        self.address = address
        self.timing = timing
        self.logger = logger
        status = RelayStatus(address: address.description)
    }

    /// Dials and runs sessions until cancelled.
    func run() async {
        var failures = 0
        while !Task.isCancelled {
            let began = ContinuousClock.now
            welcomed = false
            refusedLast = false
            do {
                try await session()
                status.lastError = nil
            } catch {
                if Task.isCancelled { break }
                let text = Self.describe(error, address: address)
                if status.lastError != text { logger.warning("relay session ended", metadata: ["relay.address": "\(address)", "error": "\(text)"]) }
                status.lastError = text
            }
            status.connected = false
            if Task.isCancelled { break }
            failures = ContinuousClock.now - began > .seconds(10) ? 1 : failures + 1
            // A relay that refused this device (removed, not yet a member) is asked again rarely.
            let policy = refusedLast ? rejectedBackoff : timing.reconnectBackoff
            let backoff = min(policy.max, policy.first * (1 << min(failures, 10)))
            try? await Task.sleep(for: backoff)
        }
    }

    private func session() async throws {
        let replica = self.replica
        let group = replica.groupID
        try await RelayDial.run(address, key: replica.deviceKey, expecting: nil, timing: timing) { relayKey, reader, writer in
            // A relay this device has not heard of yet is fine (it learns the roster entry through
            // the relay itself; a relay can read and forge nothing); one the roster names as
            // anything else, or removed, is not.
            if let known = replica.roster().devices[relayKey.deviceID], !(known.isActive && known.role == .relay) {
                // A relay the group removed: an admin tells it (a member list without it makes it
                // forget everything it stored for the group).
                if !known.isActive, known.role == .relay, replica.roster().role(of: replica.deviceID) == .admin {
                    let members = RelayMembers.sign(group: group, sequence: HybridLogicalClock.wallClock(), members: replica.relayMemberList(),
                                                    by: replica.deviceKey)
                    try await writer.write(RelayMessage.hello(group: group, members: members, enrolSecret: nil).frame)
                    _ = try? await reader.next()
                }
                throw ReplicaError.relay("the device at \(address) (\(relayKey.deviceID.shortForm)) is not a relay of this group (removed, or a device); take it out of the relays to dial")
            }
            status.relay = relayKey.deviceID.shortForm
            // A device still joining asks its inviter through the relay; the relay welcomes it
            // once the inviter's node has admitted it (PROTOCOL §20.6).
            if let join = await replica.pendingJoin, !join.isRecovery {
                pendingJoin = join
                try await writer.write(RelayMessage.join(group: group, inviter: join.inviter).frame)
            } else {
                pendingJoin = nil
                try await writer.write(RelayMessage.hello(group: group, members: nil, enrolSecret: nil).frame)
            }
            let (stream, continuation) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
            wake = continuation
            defer { continuation.finish() }
            try await withThrowingTaskGroup(of: Void.self) { tasks in
                tasks.addTask { try await self.uploadLoop(writer, wakes: stream) }
                tasks.addTask { try await self.tickLoop(writer) }
                defer { tasks.cancelAll() }
                while let frames = try await reader.next() {
                    try await self.handle(frames, writer: writer)
                }
                throw ReplicaError.relay("the relay closed the connection")
            }
        }
    }

    /// One line for a session's end: the relay's own words, or what the network said, plainly.
    static func describe(_ error: any Error, address: PeerAddress) -> String {
        if let error = error as? ReplicaError { return error.description }
        let text = "\(error)"
        for (needle, plain) in [("Connection refused", "connection refused (is the relay running, and is this its port?)"),
                                ("connection reset", "the connection was reset"), ("timeout", "connect timeout"),
                                ("Timeout", "connect timeout"), ("No route", "no route to the host"),
                                ("Network is unreachable", "network unreachable")] where text.contains(needle) {
            return "cannot reach the relay at \(address): \(plain)"
        }
        return "relay session with \(address) ended: \(text)"
    }

    // MARK: - Receiving

    private func handle(_ frames: [(type: UInt8, body: [UInt8])], writer: RelayDial.Writer) async throws {
        lastHeard = .now
        var blobs: [SealedBlob] = []
        for frame in frames {
            let message: RelayMessage
            do {
                message = try RelayMessage.decode(type: frame.type, body: frame.body)
            } catch {
                status.refusedBlobs += 1
                logger.warning("relay sent a malformed message", metadata: ["relay.address": "\(address)", "error": "\(error)"])
                continue
            }
            switch message {
            case .welcome(let members, let blobCount, _, let covered):
                ledger.welcomed(covered: covered)
                welcomed = true
                sentEnvelopes = []
                reportsSent = [:]
                // A relay holding many blobs gets a snapshot (it then drops what it covers).
                if blobCount >= Self.snapshotAboveBlobs { snapshotWanted = true }
                heldSequence = members.sequence
                sentMembers = members.members
                try await offerMembers(writer)
                try await writer.write(RelayMessage.want(replica.state.records.context.versionVector).frame)
            case .blob(let blob):
                blobs.append(blob)
            case .stored(let replicaID, let last, let snapshot):
                if !snapshot { ledger.stored(replicaID, through: last) }
                status.lastUpload = Date()
            case .caughtUp:
                try applyBlobs(&blobs)
                if pendingJoin != nil, try await replica.finishJoinIfAdmitted() { pendingJoin = nil }
                ledger.answeredWant()
                status.connected = true
                status.lastError = nil
                logger.info("relay caught up", metadata: ["relay.address": "\(address)"])
            case .notice(let reason, let text):
                logger.warning("relay refused an upload", metadata: ["relay.address": "\(address)", "reason": "\(reason)", "detail": "\(text)"])
                status.lastError = "\(reason): \(text)"
                if reason == .overBytes || reason == .overBlobs {
                    ledger.refusedUploads()
                    quotaPauseUntil = .now + timing.reconnectBackoff.max
                }
            case .refused(let reason, let text):
                try applyBlobs(&blobs)
                refusedLast = true
                throw ReplicaError.relay("the relay at \(address) refused: \(reason): \(text)")
            case .ping(let nonce):
                try await writer.write(RelayMessage.pong(nonce).frame)
            case .pong:
                break
            case .keys(let envelopes):
                try applyBlobs(&blobs)
                if try await replica.storeKeyEnvelopes(envelopes) > 0, lackedKey {
                    // Blobs refused for want of this key: ask again.
                    lackedKey = false
                    try await writer.write(RelayMessage.want(replica.state.records.context.versionVector).frame)
                }
            case .seen(let reports):
                receiveReports(reports)
            case .joinWelcome(let inviterKey):
                guard let join = pendingJoin, inviterKey.deviceID == join.inviter else {
                    throw ReplicaError.relay("the relay offered a key that is not the inviter's")
                }
                self.inviterKey = inviterKey
                try await replica.rememberInviterKey(inviterKey)
                let request = try JoinRequest.seal(join.entry, group: replica.groupID, joiner: replica.deviceID, to: inviterKey)
                try await writer.write(RelayMessage.joinRequest(request).frame)
                status.lastError = "waiting for the inviter (\(join.inviter.shortForm)) to admit this device through the relay"
            case .joinRequest(let request):
                do {
                    let name = try await replica.admitThroughRelay(request, maxClockSkew: timing.maxClockSkew)
                    logger.info("admitted \(name) through the relay", metadata: ["relay.address": "\(address)"])
                } catch {
                    logger.warning("refused a join request from the relay", metadata: ["relay.address": "\(address)", "error": "\(error)"])
                }
            case .hello, .upload, .want, .members, .join:
                logger.warning("relay sent a device's message", metadata: ["relay.address": "\(address)"])
            }
        }
        try applyBlobs(&blobs)
        if pendingJoin != nil, try await replica.finishJoinIfAdmitted() { pendingJoin = nil }
        wake?.yield()
    }

    /// Compaction reports from the relay: those the roster lets count are recorded, and a
    /// compaction step follows if they grew what is known (PROTOCOL §19).
    private func receiveReports(_ reports: [SeenReport]) {
        let roster = replica.roster()
        let valid = reports.filter { if case .valid = $0.verdict(in: roster) { return true } else { return false } }
        for report in valid where report.time > reportsSent[report.replica] ?? 0 { reportsSent[report.replica] = report.time }
        // Recorded as sync records them: one signed by this store's lost future makes it recover
        // from the restore at once (StoreSyncStorage.recordSeen).
        let storage = StoreSyncStorage(replica.store, key: replica.deviceKey, groupID: replica.groupID)
        guard !valid.isEmpty, let recorded = try? storage.recordSeen(valid) else { return }
        if recorded.leftIncarnation != nil || recorded.movedEvents > 0 {
            logger.warning("a report this store did not sign shows it was restored from an older copy; recovered",
                           metadata: ["relay.address": "\(address)", "restore.moved": "\(recorded.movedEvents)"])
            if recorded.leftIncarnation != nil { Task { [replica] in await replica.resumeSyncAfterRestore() } }
        }
        if recorded.grew { replica.scheduleCompaction() }
    }

    /// Signs this device's report when its context grew, and gives the relay every report it
    /// was not given yet (its own and those it holds of others).
    private func offerReports(_ writer: RelayDial.Writer) async throws {
        let store = replica.store
        let held = store.seenReports()
        let own = held.first { $0.replica == replica.replicaID }
        let context = store.state.records.context
        if own?.context != context, !context.isEmpty {
            let report = SeenReport.signed(by: replica.deviceKey, group: replica.groupID, replica: replica.replicaID,
                                           time: max(HybridLogicalClock.wallClock(), (own?.time ?? 0) + 1), context: context)
            try store.saveOwnReport(report)
            // This device's own report counts too: a step may now find more stable (the
            // others' reports may all be in already, and none is coming to trigger it).
            replica.scheduleCompaction()
        }
        let new = store.seenReports().filter { $0.time > reportsSent[$0.replica] ?? 0 }
        guard !new.isEmpty else { return }
        try await writer.write(RelayMessage.seen(new).frame)
        for report in new { reportsSent[report.replica] = report.time }
    }

    private func applyBlobs(_ blobs: inout [SealedBlob]) throws {
        guard !blobs.isEmpty else { return }
        defer { blobs = [] }
        let relay = "relay \(status.relay ?? address.description)"
        let (applied, refused) = try replica.applyRelayBlobs(blobs, relay: relay, maxClockSkew: timing.maxClockSkew, inviter: inviterKey)
        for blob in applied {
            ledger.received(replica: blob.replica, first: blob.firstCounter, last: blob.lastCounter, head: blob.head, covers: blob.covers)
        }
        for reason in refused {
            // Sealed with a key that has not reached this device yet (a device joining, a new
            // epoch): asked again when keys arrive, not a fault of the relay's.
            if reason.contains("does not hold") {
                lackedKey = true
                logger.debug("a blob waits for its key", metadata: ["relay.address": "\(address)", "reason": "\(reason)"])
                continue
            }
            status.refusedBlobs += 1
            // The watchdog names the relay that sent it.
            logger.warning("refused a blob from \(relay)", metadata: ["relay.address": "\(address)", "reason": "\(reason)"])
        }
    }

    // MARK: - Sending

    /// An admin sends a newer member list when the roster's differs from the relay's, and
    /// delivers the data key to devices admitted since.
    private func offerMembers(_ writer: RelayDial.Writer) async throws {
        guard replica.roster().role(of: replica.deviceID) == .admin else { return }
        let members = replica.relayMemberList()
        guard members != sentMembers else { return }
        // Sequences follow the wall clock (ms), so lists of two admins order without coordination.
        heldSequence = max(heldSequence + 1, HybridLogicalClock.wallClock())
        let statement = RelayMembers.sign(group: replica.groupID, sequence: heldSequence, members: members, by: replica.deviceKey)
        try await writer.write(RelayMessage.members(statement).frame)
        sentMembers = members
        _ = try? await replica.deliverDataKeys()
    }

    private func uploadLoop(_ writer: RelayDial.Writer, wakes: AsyncStream<Void>) async throws {
        let subscription = replica.store.commits.subscribe(CommitInterest(collections: nil))
        defer { subscription.cancel() }
        let changes = Task { [weak self] in
            while await subscription.waitForChanges() {
                _ = subscription.drain()
                await self?.poke()
            }
        }
        defer { changes.cancel() }
        for await _ in wakes {
            try Task.checkCancellation()
            try await replica.cacheDataKeys()
            try await offerMembers(writer)
            try await offerEnvelopes(writer)
            try await uploadWhatTheRelayLacks(writer)
        }
    }

    private func poke() { wake?.yield() }

    /// Gives the relay the key envelopes this device holds that it has not given yet (the
    /// relay keeps those an admin signed, for devices that never meet the admin).
    private func offerEnvelopes(_ writer: RelayDial.Writer) async throws {
        let new = Replica.envelopes(in: replica.state).filter { !sentEnvelopes.contains($0.bytes) }
        guard !new.isEmpty else { return }
        for start in stride(from: 0, to: new.count, by: 1024) {
            try await writer.write(RelayMessage.keys(Array(new[start..<min(start + 1024, new.count)])).frame)
        }
        sentEnvelopes.formUnion(new.map(\.bytes))
    }

    private func uploadWhatTheRelayLacks(_ writer: RelayDial.Writer) async throws {
        guard welcomed else { return }
        if let pause = quotaPauseUntil, ContinuousClock.now < pause { return }
        quotaPauseUntil = nil
        let held = replica.state.records.context.versionVector
        for (replicaID, after) in ledger.uploads(held: held) {
            guard let (blob, last) = try replica.sealEvents(of: replicaID, after: after) else { continue }
            ledger.uploading(replicaID, through: last)
            try await writer.write(RelayMessage.upload(blob).frame)
        }
        status.pending = held.reduce(0) { total, entry in total + entry.value - min(entry.value, ledger.relayHolds[entry.key, default: 0]) }
    }

    /// Uploads a snapshot now (after compaction, or when the relay holds many blobs).
    func snapshotRequested() { snapshotWanted = true; wake?.yield() }
    private var snapshotWanted = false

    private func tickLoop(_ writer: RelayDial.Writer) async throws {
        var nonce: UInt64 = 0
        while !Task.isCancelled {
            try await Task.sleep(for: timing.keepaliveInterval)
            nonce += 1
            try await writer.write(RelayMessage.ping(nonce).frame)
            if try await tick(writer) { writer.close() }
        }
    }

    /// Checks liveness and withholding; true if the relay has been silent too long.
    private func tick(_ writer: RelayDial.Writer) async throws -> Bool {
        if ledger.caughtUp { try await offerReports(writer) }
        if snapshotWanted, let snapshot = try replica.sealSnapshot() {
            snapshotWanted = false
            try await writer.write(RelayMessage.upload(snapshot).frame)
        }
        let held = replica.state.records.context.versionVector
        let found = ledger.withheld(held: held, now: ContinuousClock.now - started, bound: timing.relayWithholdingBound)
        status.withheld = found.map(\.description)
        var news = false
        for finding in found where reported.insert(finding.description).inserted {
            news = true
            logger.warning("relay \(status.relay ?? address.description) withholds \(finding)", metadata: ["relay.address": "\(address)"])
        }
        // The library's health hears of it too (healthUpdates()).
        if news { Task { [replica] in await replica.publishHealth() } }
        wake?.yield()
        return ContinuousClock.now - lastHeard > timing.deadPeerTimeout * 3
    }
}
