import Crypto
import Foundation
import Logging
@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncReplication
import PeerSyncSeal
import Synchronization

/// One device's connection to the relay, as the service sees it: whoever carries the bytes
/// (NIO in PeerSyncNetwork, a pipe in tests) implements it.
package protocol RelayClient: AnyObject, Sendable {
    /// The device the transport authenticated (its TLS certificate's key).
    var device: DeviceID { get }
    /// Queues a frame without waiting (forwarding to connected devices). A connection whose
    /// queue passes its bound closes (the device reconnects and catches up from storage).
    func offer(_ frame: [UInt8])
    func close()
}

/// What the connection's own loop carries out, in order, for one message received.
package enum RelayReply: Sendable, Equatable {
    case send([UInt8])
    /// Send these blobs from storage (reading a few at a time, each write awaited), then `then`.
    case stream(group: GroupID, blobs: [Int64], then: [UInt8])
    /// Close the connection (after what precedes).
    case close
}

/// A relay's figures for `peersync relay` and the benchmarks.
package struct RelayFigures: Sendable, Equatable {
    public var groups = 0
    public var connections = 0
    public var blobs = 0
    public var bytes = 0
    public var uploads = 0
    public var forwarded = 0
    public var refusedConnections = 0
}

/// The relay: groups, their member lists and blobs, and the connected devices (docs/RELAY.md).
/// Decisions are ``RelayGroup``'s; this actor keeps the state, writes through ``RelayStorage``
/// and forwards new blobs to the group's other connections.
package actor RelayService {
    public nonisolated let key: DeviceKey
    private let enrolSecret: [UInt8]
    private let storage: any RelayStorage
    private let limits: SyncLimits
    private let logger: Logger
    private var groups: [GroupID: RelayGroup] = [:]
    private struct Connection {
        let client: any RelayClient
        var group: GroupID?
        /// A device not yet a member, asking its inviter through the relay: group and inviter.
        var joining: (group: GroupID, inviter: DeviceID)?
    }
    private var connections: [ObjectIdentifier: Connection] = [:]
    private var byGroup: [GroupID: Set<ObjectIdentifier>] = [:]
    private var figures = RelayFigures()

    /// A relay with `key` (its device key: what admins enrol), admitting new groups that present
    /// `enrolSecret`, storing in `storage`.
    public init(key: DeviceKey, enrolSecret: [UInt8], storage: any RelayStorage, limits: SyncLimits = SyncLimits(),
                logger: Logger = Logger(label: "peersync.relay")) throws {
        self.key = key
        self.enrolSecret = enrolSecret
        self.storage = storage
        self.limits = limits
        self.logger = logger
        for group in try storage.load() {
            groups[group.members.groupID] = RelayGroup(members: group.members, blobs: group.blobs, envelopes: group.envelopes,
                                                       reports: group.reports)
        }
    }

    /// The code an admin needs to enrol this relay (``RelayCode``).
    public nonisolated var code: RelayCode { RelayCode(relay: key.deviceID, secret: enrolSecret) }

    public func counts() -> RelayFigures {
        var figures = self.figures
        figures.groups = groups.count
        figures.connections = connections.count
        figures.blobs = groups.values.reduce(0) { $0 + $1.blobCount }
        figures.bytes = groups.values.reduce(0) { $0 + $1.byteCount }
        return figures
    }

    /// The group's state (tests, status).
    public func group(_ id: GroupID) -> RelayGroup? { groups[id] }

    /// A connection opened; false (and it should close) when the relay holds as many as it may.
    public func opened(_ client: any RelayClient) -> Bool {
        guard connections.count < limits.relayConnections else {
            figures.refusedConnections += 1
            client.offer(RelayMessage.refused(.relayFull, "the relay holds \(connections.count) connections, its limit").frame)
            return false
        }
        connections[ObjectIdentifier(client)] = Connection(client: client)
        return true
    }

    /// Whether the connection has said hello (connections that do not are closed after the handshake timeout).
    public func greeted(_ client: any RelayClient) -> Bool {
        connections[ObjectIdentifier(client)].map { $0.group != nil || $0.joining != nil } ?? false
    }

    public func closed(_ client: any RelayClient) {
        let id = ObjectIdentifier(client)
        if let group = connections.removeValue(forKey: id)?.group { byGroup[group]?.remove(id) }
    }

    /// Handles frames from `client`; returns what its loop must do.
    public func received(_ frames: [(type: UInt8, body: [UInt8])], from client: any RelayClient) -> [RelayReply] {
        var replies: [RelayReply] = []
        for frame in frames {
            let message: RelayMessage
            do {
                message = try RelayMessage.decode(type: frame.type, body: frame.body)
            } catch {
                return replies + refuse(client, .malformed, "\(error)")
            }
            replies += handle(message, from: client)
            if replies.last == .close { return replies }
        }
        return replies
    }

    private func refuse(_ client: any RelayClient, _ reason: RelayRefusal, _ text: String) -> [RelayReply] {
        logger.info("refused", metadata: ["device": "\(client.device.shortForm)", "reason": "\(reason)", "detail": "\(text)"])
        closed(client)
        figures.refusedConnections += 1
        return [.send(RelayMessage.refused(reason, text).frame), .close]
    }

    private func handle(_ message: RelayMessage, from client: any RelayClient) -> [RelayReply] {
        let id = ObjectIdentifier(client)
        guard let connection = connections[id] else { return [.close] }
        switch message {
        case .hello(let groupID, let members, let secret):
            guard connection.group == nil else { return refuse(client, .malformed, "a second hello") }
            return hello(client, group: groupID, members: members, secret: secret)
        case .ping(let nonce):
            return [.send(RelayMessage.pong(nonce).frame)]
        case .pong:
            return []
        case .join(let groupID, let inviter):
            guard connection.group == nil, connection.joining == nil else { return refuse(client, .malformed, "a join after hello") }
            guard let group = groups[groupID] else { return refuse(client, .unknownGroup, "this relay serves no group \(groupID)") }
            if group.admits(client.device) { return hello(client, group: groupID, members: nil, secret: nil) }
            guard let key = group.acceptsJoin(of: client.device, inviter: inviter) else {
                return refuse(client, .notMember, "device \(inviter.shortForm) is not an admin of group \(groupID) at this relay, or the device was removed")
            }
            connections[id]?.joining = (groupID, inviter)
            return [.send(RelayMessage.joinWelcome(inviterKey: key).frame)]
        case .joinRequest(let request):
            guard let joining = connection.joining, request.groupID == joining.group, request.joiner == client.device,
                  request.inviter == joining.inviter, var group = groups[joining.group] else {
                return refuse(client, .malformed, "a join request out of place, or for another device")
            }
            group.hold(request)
            groups[joining.group] = group
            let frame = RelayMessage.joinRequest(request).frame
            for other in byGroup[joining.group, default: []] where connections[other]?.client.device == request.inviter {
                connections[other]?.client.offer(frame)
            }
            return []
        default:
            break
        }
        guard let groupID = connection.group, var group = groups[groupID] else {
            return refuse(client, .malformed, "a \(message) before hello")
        }
        // Membership is checked again on every message: a list that removed this device since
        // it connected ends its session.
        guard group.admits(client.device) else {
            return refuse(client, .notMember, "device \(client.device.shortForm) is not a member of group \(groupID) at this relay")
        }
        switch message {
        case .want(let have):
            let plan = group.plan(for: have)
            return [.stream(group: groupID, blobs: plan, then: RelayMessage.caughtUp(UInt64(plan.count)).frame)]
        case .upload(let blob):
            switch group.decide(blob, from: client.device, limits: limits) {
            case .duplicate:
                return [.send(RelayMessage.stored(replica: blob.replica, last: blob.lastCounter, snapshot: blob.kind == .snapshot).frame)]
            case .refuse(let reason, let text):
                logger.info("upload refused", metadata: ["device": "\(client.device.shortForm)", "reason": "\(reason)", "detail": "\(text)"])
                return [.send(RelayMessage.notice(reason, text).frame)]
            case .store(let dropping):
                let stored: Int64
                do {
                    stored = try storage.insert(blob, dropping: dropping)
                } catch {
                    logger.error("storage failed", metadata: ["error": "\(error)"])
                    return [.send(RelayMessage.notice(.other, "the relay could not store the blob: \(error)").frame)]
                }
                group.stored(StoredBlobInfo(id: stored, blob: blob), dropping: dropping)
                groups[groupID] = group
                figures.uploads += 1
                let frame = RelayMessage.blob(blob).frame
                for other in byGroup[groupID, default: []] where other != id {
                    connections[other]?.client.offer(frame)
                    figures.forwarded += 1
                }
                return [.send(RelayMessage.stored(replica: blob.replica, last: blob.lastCounter, snapshot: blob.kind == .snapshot).frame)]
            }
        case .members(let newer):
            return members(newer, for: &group, from: client)
        case .seen(let offered):
            let new = group.newReports(offered)
            guard !new.isEmpty else { return [] }
            do { try storage.saveReports(new, group: groupID) } catch {
                return [.send(RelayMessage.notice(.other, "the relay could not store compaction reports: \(error)").frame)]
            }
            group.stored(reports: new)
            groups[groupID] = group
            let frame = RelayMessage.seen(new).frame
            for other in byGroup[groupID, default: []] where other != id { connections[other]?.client.offer(frame) }
            return []
        case .keys(let offered):
            let new = group.newEnvelopes(offered)
            guard !new.isEmpty else { return [] }
            do { try storage.saveEnvelopes(new) } catch {
                return [.send(RelayMessage.notice(.other, "the relay could not store key envelopes: \(error)").frame)]
            }
            group.stored(envelopes: new)
            groups[groupID] = group
            for other in byGroup[groupID, default: []] where other != id {
                guard let connection = connections[other] else { continue }
                let theirs = new.filter { $0.recipient == connection.client.device }
                if !theirs.isEmpty { connection.client.offer(RelayMessage.keys(theirs).frame) }
            }
            return []
        default:
            return refuse(client, .malformed, "a relay-to-device message sent to the relay")
        }
    }

    private func hello(_ client: any RelayClient, group groupID: GroupID, members: RelayMembers?, secret: [UInt8]?) -> [RelayReply] {
        let id = ObjectIdentifier(client)
        var replies: [RelayReply] = []
        if var group = groups[groupID] {
            if let members {
                replies += self.members(members, for: &group, from: client)
                if replies.last == .close { return replies }
            }
            guard group.admits(client.device) else {
                return refuse(client, .notMember, "device \(client.device.shortForm) is not a member of group \(groupID) at this relay (member list \(group.members.sequence))")
            }
        } else {
            guard let secret else {
                return refuse(client, .unknownGroup, "this relay serves no group \(groupID); an admin enrols it with the relay's code (peersync relays add)")
            }
            guard let members, Self.equal(secret, enrolSecret) else {
                return refuse(client, .badEnrolment, "the enrolment secret is not this relay's (check the relay code)")
            }
            guard members.groupID == groupID, members.isSelfSigned, members.member(key.deviceID)?.role == .relay,
                  members.member(client.device)?.role == .admin else {
                return refuse(client, .badEnrolment, "the member list must be signed by an admin, name this relay as a relay and the enrolling device as an admin")
            }
            guard groups.count < limits.relayGroups else {
                return refuse(client, .relayFull, "the relay serves \(groups.count) groups, its limit")
            }
            do { try storage.saveMembers(members) } catch {
                return refuse(client, .other, "the relay could not store the group: \(error)")
            }
            groups[groupID] = RelayGroup(members: members)
            logger.info("group enrolled", metadata: ["group": "\(groupID)", "by": "\(client.device.shortForm)"])
        }
        guard byGroup[groupID, default: []].count < limits.relayGroupConnections else {
            return refuse(client, .overConnections, "group \(groupID) has \(limits.relayGroupConnections) connections at this relay, its quota")
        }
        connections[id]?.group = groupID
        byGroup[groupID, default: []].insert(id)
        let group = groups[groupID]!
        replies += welcomeFrames(group, for: client.device).map { .send($0) }
        for request in group.joinRequests.values where request.inviter == client.device {
            replies.append(.send(RelayMessage.joinRequest(request).frame))
        }
        return replies
    }

    /// What a device hears when its session begins: the welcome, its key envelopes, the reports.
    private func welcomeFrames(_ group: RelayGroup, for device: DeviceID) -> [[UInt8]] {
        var frames = [RelayMessage.welcome(members: group.members, blobs: UInt64(group.blobCount), bytes: UInt64(group.byteCount),
                                           covered: group.covered).frame]
        let keys = group.envelopes(for: device)
        if !keys.isEmpty { frames.append(RelayMessage.keys(keys).frame) }
        if !group.reports.isEmpty { frames.append(RelayMessage.seen(Array(group.reports.values)).frame) }
        return frames
    }

    private func members(_ newer: RelayMembers, for group: inout RelayGroup, from client: any RelayClient) -> [RelayReply] {
        let groupID = group.members.groupID
        switch group.decide(members: newer, relay: key.deviceID) {
        case .stale:
            return []
        case .refuse(let reason, let text):
            return [.send(RelayMessage.notice(reason, text).frame)]
        case .relayRemoved:
            // The group removed this relay: forget everything it stored for it.
            try? storage.deleteGroup(groupID)
            groups[groupID] = nil
            for other in byGroup.removeValue(forKey: groupID) ?? [] {
                connections[other]?.client.offer(RelayMessage.refused(.notEnrolled, "the group removed this relay").frame)
                connections[other]?.client.close()
                connections[other] = nil
            }
            logger.info("group left (relay removed)", metadata: ["group": "\(groupID)"])
            return refuse(client, .notEnrolled, "the group removed this relay; it forgot the group's data")
        case .take:
            do { try storage.saveMembers(newer) } catch {
                return [.send(RelayMessage.notice(.other, "the relay could not store the member list: \(error)").frame)]
            }
            group.take(newer)
            // Devices waiting to join that the new list admits are welcomed on their connection.
            group.dropJoinRequests(admitted: group.admits)
            groups[groupID] = group
            for (other, connection) in connections where connection.joining?.group == groupID && group.admits(connection.client.device) {
                connections[other]?.joining = nil
                connections[other]?.group = groupID
                byGroup[groupID, default: []].insert(other)
                for frame in welcomeFrames(group, for: connection.client.device) { connection.client.offer(frame) }
            }
            // Devices the new list no longer names lose their sessions now.
            for other in byGroup[groupID, default: []] {
                guard let connection = connections[other], !group.admits(connection.client.device) else { continue }
                connection.client.offer(RelayMessage.refused(.notMember, "device \(connection.client.device.shortForm) is not a member of the group any more").frame)
                connection.client.close()
                byGroup[groupID]?.remove(other)
                connections[other]?.group = nil
            }
            return []
        }
    }

    /// Reads blobs for a stream reply (off the actor: storage is thread-safe).
    public nonisolated func blobBytes(_ ids: [Int64]) throws -> [Int64: [UInt8]] { try storage.bytes(of: ids) }

    private static func equal(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        return zip(a, b).reduce(0) { $0 | ($1.0 ^ $1.1) } == 0
    }

    /// A new enrolment secret.
    public static func makeSecret() -> [UInt8] { (0..<16).map { _ in UInt8.random(in: 0...255) } }
}
