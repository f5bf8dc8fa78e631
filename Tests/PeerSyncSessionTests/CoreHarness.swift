import Foundation
import PeerSync
@testable import PeerSyncReplication
@testable import PeerSyncNetwork
import PeerSyncTestSupport
@testable import PeerSyncWire
import ShiftSchedulerModel

/// One node's replication core over an in-memory replica state: no sockets, no clock, no SQLite.
/// Commits are carried out by joining into `state` when the test says so.
struct CoreNode {
    var core: ReplicationCore
    var state: ReplicaState
    var pendingCommits: [ReplicationCore.CommitRequest] = []
    var committedBatches: [[RecordMap]] = []
    var events: [NodeEvent] = []
    var logs: [CoreLog] = []
    var closedTransports: Set<SessionID> = []
    /// Instants the core asked the writer to be woken at (deltas held back to share a frame).
    var wakes: [MonotonicInstant] = []
    /// Instants the core asked ``ReplicationCore/commitDue(now:state:)`` to be called at.
    var commitDeadlines: [MonotonicInstant] = []
    var failNextCommit = false
    /// Attachment file work the core asked for (tests answer it themselves).
    var attachmentIO: [AttachmentIO] = []
    /// Compaction reports this node's "storage" recorded (others'; nil: it keeps none).
    var seen: SeenReports?
    /// The last report this node signed and "stored".
    var ownReport: SeenReport?
    /// Records complete rounds dropped (the peer's group purged them).
    var completeRoundDrops: [RecordKey] = []
    /// The latest instant this node was driven at (opening sessions, commits).
    var lastNow: MonotonicInstant?

    /// Devices "a"…"f" of one group (device "a" created it; all are admins).
    static let group = try! LocalGroup.make(names: ["a", "b", "c", "d", "e", "f"])

    /// Node `name` ("a"…"f") of ``group``; `group: nil` makes a device of no group's roster.
    init(_ name: String, maxFrameBytes: Int = WireLimits.defaultMaxFrameBytes, timing: SyncTiming = .sendingAtOnce,
         outboxDeltaBytes: Int? = nil, transfer: TransferMode = .deltas, identity: LocalIdentity? = nil,
         attachments: Bool = false, signedReports: Bool = false, deflateChunks: Bool = true) {
        state = ReplicaState(name: name)
        let member = Self.group.names.firstIndex(of: name) ?? 0
        let identity = identity ?? Self.group.identity(member)
        for entry in Self.group.entries { state.write(entry.fields, to: entry.recordKey) }
        if identity.groupID == Self.group.groupID, identity.key.deviceID == Self.group.keys[member].deviceID {
            let roster = state.roster(of: Self.group.groupID)
            let claim = try! RosterEntry.make(.writer(state.replicaID), context: roster.context(for: identity.key.deviceID, at: state.nextTimestamp()),
                                              signer: identity.key)
            state.write(claim.fields, to: claim.recordKey)
        }
        var limits = SyncLimits()
        limits.maxFrameBytes = maxFrameBytes
        if let outboxDeltaBytes { limits.outboxDeltaBytes = outboxDeltaBytes }
        seen = signedReports ? SeenReports() : nil
        core = ReplicationCore(settings: .init(localReplica: state.replicaID, name: name, timing: timing, limits: limits,
                                               transfer: transfer, identity: identity, attachments: attachments,
                                               signedReports: signedReports, deflateChunks: deflateChunks),
                               roster: state.roster(of: identity.groupID))
    }

    var replicaID: ReplicaID { state.replicaID }

    /// What this node gossips: the reports it recorded, and its own last one.
    var gossip: [SeenReport]? {
        guard let known = seen else { return nil }
        return Array(known.byReplica.values) + (ownReport.map { [$0] } ?? [])
    }

    /// The node's timer, and its own report signed if due (as the Replicator's tick does).
    mutating func tick(now: MonotonicInstant) {
        lastNow = now
        handle(core.tick(now: now))
        handle(core.refreshOwnReport(state: state, wallClock: HybridLogicalClock.wallClock()))
    }

    mutating func handle(_ actions: [ReplicationCore.Action]) {
        for action in actions {
            switch action {
            case .wake: break
            case .wakeAt(_, let instant): wakes.append(instant)
            case .closeTransport(let id): closedTransports.insert(id)
            case .commit(let request): pendingCommits.append(request)
            case .commitAt(let instant): commitDeadlines.append(instant)
            case .event(let event): events.append(event)
            case .log(let line): logs.append(line)
            case .admitDevice(let id, let device, let entries):
                if let delta = try! state.storeAdmission(entries, of: device, signer: core.settings.identity,
                                                         maxSkewMilliseconds: 300_000) {
                    handle(core.broadcast(delta, state: state, now: lastNow ?? ContinuousClock.now))
                }
                handle(core.joinerAdmitted(id, roster: state.roster(of: core.settings.identity.groupID), now: ContinuousClock.now,
                                           state: state))
            case .attachmentIO(let io):
                attachmentIO.append(io)
            case .recordSeen(let reports):
                guard var known = seen else { break }
                var grew = false
                for report in reports where report.replica != replicaID { grew = known.record(report) || grew }
                seen = known
                if grew { handle(core.gossipChanged(now: lastNow ?? ContinuousClock.now)) }
            case .saveOwnReport(let report):
                ownReport = report
                handle(core.ownReportSaved(report, now: lastNow ?? ContinuousClock.now))
            }
        }
    }

    mutating func open(initiator: Bool, address: String, now: MonotonicInstant) -> SessionID {
        lastNow = now
        let (id, actions) = core.open(SessionOrigin(address: address, initiator: initiator), now: now,
                                      wallClock: HybridLogicalClock.wallClock(), state: state,
                                      nonce: (0..<16).map { _ in UInt8.random(in: 0...255) })
        handle(actions)
        return id
    }

    /// Carries out every pending commit (group commits as the core issued them).
    mutating func runCommits(now: MonotonicInstant) {
        lastNow = now
        while !pendingCommits.isEmpty {
            let request = pendingCommits.removeFirst()
            if failNextCommit {
                failNextCommit = false
                handle(core.commitFailed(request.id, error: "disk full", refused: false, now: now, state: state))
                continue
            }
            committedBatches.append(request.deltas)
            let outcomes = request.deltas.map { state.apply($0) }
            // As the store does for complete rounds: drop what the peer's group purged.
            for round in request.completing {
                let seen = round.stable.intersection(state.context)
                let keys = state.records.recordsPurgedElsewhere(completeKeys: round.keys, stable: seen)
                completeRoundDrops += state.dropPurgedElsewhere(keys, stable: seen).keys
            }
            handle(core.committed(request.id, outcomes: outcomes, state: state, now: now))
            // As the Replicator does: a commit that touched the roster refreshes the core's.
            if request.deltas.contains(where: \.touchesRoster) {
                handle(core.updateRoster(state.roster(of: core.settings.identity.groupID), identity: core.settings.identity, now: now))
            }
        }
    }

    /// A local edit, committed and broadcast.
    mutating func write(_ body: (inout ReplicaState) throws -> RecordMap?) rethrows {
        guard let delta = try body(&state) else { return }
        handle(core.broadcast(delta, state: state, now: lastNow ?? ContinuousClock.now))
    }

    var warnings: [CoreLog] { logs.filter { $0.level == .warning || $0.level == .error } }

    /// One write of `count` locations (`name0`, `name1`, …) of about `bytes` each, broadcast as one delta.
    mutating func writeLocations(_ count: Int, named name: String, bytes: Int = 400) throws {
        try write { state in
            var delta = RecordMap()
            for i in 0..<count {
                if let one = try state.save(Location(name: "\(name)\(i)", address: String(repeating: "x", count: bytes))) { delta.merge(one) }
            }
            return delta
        }
    }
}

/// A frame as it crossed a link.
struct WireFrame {
    let type: UInt8
    let body: [UInt8]
    let size: Int
}

/// Moves bytes between two cores' sessions, splitting frames with the receiver's limit (so any
/// frame over the limit the receiver announced throws).
struct CoreLink {
    let aSession: SessionID
    let bSession: SessionID
    var framesToB: [WireFrame] = []
    var framesToA: [WireFrame] = []
    var aClosed = false
    var bClosed = false

    /// A full mesh of three, settled, each side knowing the others' neighbours (from the acks
    /// that followed the last session).
    static func fullMesh(_ a: inout CoreNode, _ b: inout CoreNode, _ c: inout CoreNode,
                         now: MonotonicInstant) throws -> (ab: CoreLink, bc: CoreLink, ac: CoreLink) {
        var ab = connect(&a, &b, now: now)
        try ab.settle(&a, &b, now: now)
        var bc = connect(&b, &c, now: now)
        try bc.settle(&b, &c, now: now)
        var ac = connect(&a, &c, now: now)
        try ac.settle(&a, &c, now: now)
        try ab.settle(&a, &b, now: now)
        try bc.settle(&b, &c, now: now)
        try ac.settle(&a, &c, now: now)
        return (ab, bc, ac)
    }

    static func connect(_ a: inout CoreNode, _ b: inout CoreNode, now: MonotonicInstant) -> CoreLink {
        let aSession = a.open(initiator: true, address: "b", now: now)
        let bSession = b.open(initiator: false, address: "a", now: now)
        return CoreLink(aSession: aSession, bSession: bSession)
    }

    /// Pumps both directions and runs commits until nothing moves (bounded).
    mutating func settle(_ a: inout CoreNode, _ b: inout CoreNode, now: MonotonicInstant, rounds: Int = 1_000) throws {
        for _ in 0..<rounds {
            guard !aClosed else { return }
            let (movedAB, aDone) = try Self.pump(from: &a, aSession, to: &b, bSession, limit: b.core.settings.limits.maxFrameBytes,
                                                 record: &framesToB, now: now)
            if aDone || a.closedTransports.contains(aSession) || b.closedTransports.contains(bSession) {
                end(&a, &b)
                return
            }
            let (movedBA, bDone) = try Self.pump(from: &b, bSession, to: &a, aSession, limit: a.core.settings.limits.maxFrameBytes,
                                                 record: &framesToA, now: now)
            if bDone || a.closedTransports.contains(aSession) || b.closedTransports.contains(bSession) {
                end(&a, &b)
                return
            }
            let commits = !a.pendingCommits.isEmpty || !b.pendingCommits.isEmpty
            a.runCommits(now: now)
            b.runCommits(now: now)
            if !movedAB && !movedBA && !commits { return }
        }
        throw HarnessError("link did not settle")
    }

    /// Moves at most one batch of about `budget` bytes each way (a → b, then b → a) and runs
    /// both sides' commits: for stopping a round part-way.
    mutating func step(_ a: inout CoreNode, _ b: inout CoreNode, budget: Int, now: MonotonicInstant) throws {
        _ = try Self.pump(from: &a, aSession, to: &b, bSession, limit: b.core.settings.limits.maxFrameBytes,
                          record: &framesToB, now: now, budget: budget, maxBatches: 1)
        _ = try Self.pump(from: &b, bSession, to: &a, aSession, limit: a.core.settings.limits.maxFrameBytes,
                          record: &framesToA, now: now, budget: budget, maxBatches: 1)
        a.runCommits(now: now)
        b.runCommits(now: now)
    }

    /// The connection is gone: both ends are told.
    mutating func end(_ a: inout CoreNode, _ b: inout CoreNode) {
        a.runCommits(now: ContinuousClock.now)
        b.runCommits(now: ContinuousClock.now)
        aClosed = true
        bClosed = true
        a.handle(a.core.transportEnded(aSession, reason: .connectionLost(detail: "closed")))
        b.handle(b.core.transportEnded(bSession, reason: .connectionLost(detail: "closed")))
    }

    private static func pump(
        from source: inout CoreNode, _ sourceSession: SessionID, to target: inout CoreNode, _ targetSession: SessionID,
        limit: Int, record: inout [WireFrame], now: MonotonicInstant, budget: Int = 1 << 20, maxBatches: Int = .max
    ) throws -> (moved: Bool, closed: Bool) {
        var moved = false
        for _ in 0..<maxBatches {
            let gossip = source.gossip
            let (batch, actions) = source.core.nextBatch(sourceSession, budget: budget, now: now, state: source.state,
                                                         gossip: { gossip })
            source.handle(actions)
            guard let batch else { return (moved, false) }
            moved = true
            var splitter = FrameSplitter(maxFrameBytes: limit)
            splitter.append(batch.bytes)
            while let frame = try splitter.next() {
                let size = frame.body.count + 1 + Varint.size(of: UInt64(frame.body.count + 1))
                record.append(WireFrame(type: frame.type, body: frame.body, size: size))
                target.handle(target.core.receive(targetSession, type: frame.type, body: frame.body, now: now,
                                                  wallClock: HybridLogicalClock.wallClock(), state: target.state))
            }
            if batch.closeAfter { return (true, true) }
        }
        return (moved, false)
    }
}

struct HarnessError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

extension Array where Element == WireFrame {
    func messages() -> [Message] { compactMap { try? Message.decode(type: $0.type, body: $0.body) } }
}

extension SyncTiming {
    /// Every delta at once: the harness moves bytes at one fixed instant, so a delta held back to
    /// share a frame would wait for a time that never comes. Coalescing has its own test.
    static var sendingAtOnce: SyncTiming {
        var timing = SyncTiming()
        timing.deltaCoalescing = .zero
        return timing
    }
}
