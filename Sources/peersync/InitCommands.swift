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
    @Option(help: "Enrol this new device as an admin of a group whose admin devices are lost, with its recovery code (PSR-…).")
    var recover: String?

    func run() async throws {
        let name = self.name ?? ProcessInfo.processInfo.hostName
        // Check everything before writing anything.
        let replica: Replica
        if let recover {
            guard join == nil else { throw CLIError("--recover and --join exclude each other") }
            replica = try Replica.recover(at: options.directory, name: name, recoveryCode: recover)
            print("created replica \(replica.replicaID) (\(name)) in \(options.directory)")
            print("device \(replica.deviceID)")
            print("recovering the group as an admin: run `peersync run` (with --peer HOST:PORT of any device of the group where multicast is blocked); then make a new recovery code with `peersync recovery new`")
        } else if let join {
            switch Result(catching: { try InviteCode(parsing: join) }) {
            case .success(let code):
                replica = try Replica.join(at: options.directory, name: name, invite: code)
                print("created replica \(replica.replicaID) (\(name)) in \(options.directory)")
                print("device \(replica.deviceID)")
                print("joining the group of the invite; run `peersync run` to complete it (with --peer INVITER-HOST:PORT where multicast is blocked, or --relay HOST:PORT through a relay of the group)")
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
            printRecoveryCode(try await replica.makeRecoveryCode())
        }
    }
}

struct Join: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Join another group with an invite code, bringing this store's records into it (or, with --fresh, starting from the group's data).",
        discussion: """
            For a device used alone first: its records are written again by this device in the new \
            group, as they read now (same IDs), and reach the group at the first `peersync run` that \
            meets a member. The old group's roster, conflict log and synced settings stay behind; \
            device-local settings and attachment files stay. Stop `peersync run` on this store first. \
            Without a store here, it is `peersync init --join CODE`.
            """)

    @OptionGroup var options: StoreOptions
    @Argument(help: "The invite code (from `peersync invite` on an admin of the group to join).") var code: String
    @Flag(help: "Leave this store's records behind and start from the group's data.") var fresh = false
    @Option(help: "A name people will recognise (default: this replica's name, or the host name).") var name: String?

    func run() async throws {
        let invite: InviteCode
        do { invite = try InviteCode(parsing: code) } catch { throw CLIError("\(error)") }
        var name = self.name
        let existing = FileManager.default.fileExists(atPath: options.directory)
        if name == nil, existing, let current = try? Replica.open(at: options.directory) {
            name = current.state.name
            await current.close()
        }
        let replica = try Replica.join(at: options.directory, name: name ?? ProcessInfo.processInfo.hostName, invite: invite,
                                       keepingData: !fresh)
        let records = replica.state.records.allRecords.filter { $0.1.isVisible && !$0.0.collection.hasPrefix("_") }.count
        print("joining the group of the invite as \(replica.deviceID.shortForm) (\(replica.state.name)), with \(records) record\(records == 1 ? "" : "s") of this store")
        print("run `peersync run` to complete it (with --peer INVITER-HOST:PORT where multicast is blocked, or --relay HOST:PORT through a relay of the group)")
        await replica.close()
    }
}

struct Leave: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Leave this store's group and keep its records, in a new group of which this device is the only admin.",
        discussion: """
            The old group still lists this device until one of its admins removes it \
            (`peersync devices remove`); what this device synced there stays with that group. \
            Stop `peersync run` on this store first.
            """)

    @OptionGroup var options: StoreOptions
    @Option(help: "The new group's name (default: \"NAME's group\").") var groupName: String?

    func run() async throws {
        guard FileManager.default.fileExists(atPath: options.directory) else {
            throw CLIError("no replica at \(options.directory) (create one with `peersync init`, or pass --store)")
        }
        let replica = try Replica.leaveGroup(at: options.directory, groupName: groupName)
        let records = replica.state.records.allRecords.filter { $0.1.isVisible && !$0.0.collection.hasPrefix("_") }.count
        print("left the group; \(records) record\(records == 1 ? "" : "s") kept in the new group \"\(replica.roster().groupName ?? "")\", of which this device is the admin")
        await replica.close()
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
