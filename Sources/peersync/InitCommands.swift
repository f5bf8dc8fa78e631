import ArgumentParser
import Foundation
import PeerSync

struct Init: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Create a replica and its device key: a new group (this device its first admin), or one joining with an invite code.",
        discussion: """
            With --join, the code comes from `peersync invite` on an admin's machine (PS2-…); the join \
            completes at the first `peersync run` that reaches the inviter (or any session with it). \
            A PS1-… code is the shared secret of a group made by the previous version: this device \
            then enrols itself as an admin of the upgraded group.
            """)

    @OptionGroup var options: StoreOptions
    @Option(help: "A name people will recognise (default: the host name).") var name: String?
    @Option(help: "Join the group of this invite code (from `peersync invite` on an admin).") var join: String?
    @Option(help: "The new group's name (default: \"NAME's group\").") var groupName: String?

    func run() async throws {
        let name = self.name ?? ProcessInfo.processInfo.hostName
        // Check everything before writing anything.
        let replica: Replica
        if let join {
            switch Result(catching: { try InviteCode(parsing: join) }) {
            case .success(let code):
                replica = try Replica.join(at: options.directory, name: name, invite: code)
                print("created replica \(replica.replicaID) (\(name)) in \(options.directory)")
                print("device \(replica.deviceID)")
                print("joining the group of the invite; run `peersync run` (with --peer INVITER-HOST:PORT where multicast is blocked) to complete it")
            case .failure(let error):
                guard case .oldStyleGroupSecret = error as? InviteCodeParseError else { throw CLIError("\(error)") }
                let secret: GroupSecret
                do { secret = try GroupSecret(inviteCode: join) } catch { throw CLIError("\(error)") }
                replica = try Replica.join(at: options.directory, name: name, legacySecret: secret)
                print("created replica \(replica.replicaID) (\(name)) in \(options.directory)")
                print("device \(replica.deviceID)")
                print("enrolled as an admin of the upgraded group (the old group secret); ask an admin to close legacy enrolment once every device has upgraded")
            }
        } else {
            replica = try Replica.create(at: options.directory, name: name, groupName: groupName)
            print("created replica \(replica.replicaID) (\(name)) in \(options.directory)")
            print("device \(replica.deviceID)")
            print("new sync group; this device is its admin. Invite other machines with: peersync invite")
        }
    }
}

struct Invite: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print a code that lets one new device join the group once, before it expires (admins only).")

    @OptionGroup var options: StoreOptions
    @Option(help: "How long the code stays valid: 24h, 30m, 7d… (default 24h).") var expires = "24h"
    @Option(help: "The new device's role: member or admin.") var role = "member"
    @Option(help: "Revoke this unused invite code instead of making one.") var revoke: String?

    func run() async throws {
        if let revoke {
            let code: InviteCode
            do { code = try InviteCode(parsing: revoke) } catch { throw CLIError("--revoke: \(error)") }
            let replica = try options.openReplica()
            do { try await replica.revokeInvite(code) } catch { throw CLIError("\(error)") }
            print("invite revoked: a device that tries it now is told so")
            return
        }
        let role: DeviceRole = switch self.role {
        case "member": .member
        case "admin": .admin
        default: throw CLIError("--role must be member or admin, not \"\(self.role)\"")
        }
        let seconds = try parseDuration(expires.hasSuffix("d") ? String(Double(expires.dropLast()).map { $0 * 24 } ?? -1) + "h" : expires)
        guard seconds > 0, seconds <= 365 * 86_400 else { throw CLIError("--expires must be more than 0 and at most 365 days") }
        let replica = try options.openReplica()
        do {
            let code = try await replica.invite(role: role, expires: .seconds(seconds))
            print(code.text)
            if isatty(STDOUT_FILENO) == 1 {  // scripts read just the code
                let until = Date(timeIntervalSinceNow: seconds)
                print("one device can join with it, as \(role), until \(ISO8601DateFormatter().string(from: until)): `peersync init --join CODE` there")
            }
        } catch {
            throw CLIError("\(error)")
        }
    }
}
