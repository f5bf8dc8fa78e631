import ArgumentParser
import Foundation
import PeerSync

/// `peersync devices`: the roster — who is in the group, added by whom, removed.
struct Devices: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "The devices of the group: list, remove, promote and demote (admins), rename.",
        subcommands: [List.self, Remove.self, Promote.self, Demote.self, Rename.self, CloseLegacy.self], defaultSubcommand: List.self)

    struct Entry: Codable {
        var deviceID: String
        var name: String
        var role: String
        var addedBy: String?
        var addedAt: Date
        var lastSeen: Date?
        var removed: Bool
        var removedBy: String?
        var removedAt: Date?
        var thisDevice: Bool
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "list", abstract: "Every device the roster knows, removed ones too.")
        @OptionGroup var options: StoreOptions
        @Flag(help: "Print JSON (docs/CLI.md).") var json = false

        func run() async throws {
            let replica = try options.openReplica()
            let roster = replica.roster()
            let seen = lastSeen(options)
            func date(_ t: HLCTimestamp) -> Date { Date(timeIntervalSince1970: Double(t.physicalMilliseconds) / 1000) }
            let entries = roster.devices.values.sorted { ($0.addedAt, $0.id) < ($1.addedAt, $1.id) }.map { device in
                Entry(deviceID: device.id.humanForm, name: device.name, role: device.role.description,
                      addedBy: device.addedBy.map { roster.devices[$0]?.name ?? $0.shortForm }, addedAt: date(device.addedAt),
                      lastSeen: device.id == replica.deviceID ? Date() : seen[device.id],
                      removed: !device.isActive, removedBy: device.removal.map { roster.devices[$0.by]?.name ?? $0.by.shortForm },
                      removedAt: device.removal.map { date($0.at) }, thisDevice: device.id == replica.deviceID)
            }
            if json { return try printJSON(entries) }
            if let join = await replica.pendingJoin {
                print("this device (\(replica.deviceID.shortForm)) is still joining through \(join.inviter.shortForm); run `peersync run` to complete it")
            }
            let formatter = ISO8601DateFormatter()
            for e in entries {
                var line = "\(e.deviceID)  \(e.name) — \(e.role)"
                if e.thisDevice { line += " (this device)" }
                line += ", added " + (e.addedBy.map { "by \($0) " } ?? "") + formatter.string(from: e.addedAt)
                if let seen = e.lastSeen, !e.thisDevice { line += ", last seen \(formatter.string(from: seen))" }
                if e.removed { line += ", REMOVED" + (e.removedBy.map { " by \($0)" } ?? "") + (e.removedAt.map { " \(formatter.string(from: $0))" } ?? "") }
                print(line)
            }
        }
    }

    struct Remove: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Remove a device for good (admins only): every node that learns of it closes its sessions and refuses its writes.")
        @OptionGroup var options: StoreOptions
        @Argument(help: "The device ID (or a unique prefix) from `peersync devices`.") var device: String

        func run() async throws {
            let replica = try options.openReplica()
            do {
                let target = try replica.device(matching: device)
                try await replica.removeDevice(target.id)
                print("removed \(target.name) (\(target.id.shortForm)); a running node shares it with the group within seconds")
            } catch let error as DeviceAdministrationError {
                throw CLIError("\(error)")
            } catch let error as ReplicaError {
                throw CLIError("\(error)")
            }
        }
    }

    struct Promote: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Make a device an admin (admins only): a second admin keeps the group administrable if one phone is lost.")
        @OptionGroup var options: StoreOptions
        @Argument(help: "The device ID (or a unique prefix) from `peersync devices`.") var device: String

        func run() async throws { try await setRole(options, device, .admin) }
    }

    struct Demote: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Make an admin a member again (admins only; never the last admin device).")
        @OptionGroup var options: StoreOptions
        @Argument(help: "The device ID (or a unique prefix) from `peersync devices`.") var device: String

        func run() async throws { try await setRole(options, device, .member) }
    }

    struct Rename: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Rename a device (this one, or any as an admin).")
        @OptionGroup var options: StoreOptions
        @Argument(help: "The device ID (or a unique prefix).") var device: String
        @Argument(help: "The new name.") var name: String

        func run() async throws {
            let replica = try options.openReplica()
            do {
                let target = try replica.device(matching: device)
                try await replica.renameDevice(target.id, to: name)
                print("renamed \(target.id.shortForm) to \(name)")
            } catch let error as DeviceAdministrationError {
                throw CLIError("\(error)")
            } catch let error as ReplicaError {
                throw CLIError("\(error)")
            }
        }
    }

    struct CloseLegacy: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "close-legacy",
            abstract: "In a group upgraded from a shared secret: stop devices that know the old secret from enrolling (admins only).")
        @OptionGroup var options: StoreOptions

        func run() async throws {
            let replica = try options.openReplica()
            do {
                try await replica.closeLegacyEnrolment()
                print("legacy enrolment closed: the old group secret no longer admits devices")
            } catch {
                throw CLIError("\(error)")
            }
        }
    }
}

/// When the running node last had a session with each device (from its status file).
func lastSeen(_ options: StoreOptions) -> [DeviceID: Date] {
    guard let node = runningNode(options) else { return [:] }
    var seen: [DeviceID: Date] = [:]
    for peer in node.peers {
        if let text = peer.deviceID, let id = try? DeviceID(parsing: text) { seen[id] = node.updatedAt }
    }
    return seen
}

/// Promotes or demotes a device; errors as one line.
private func setRole(_ options: StoreOptions, _ device: String, _ role: DeviceRole) async throws {
    let replica = try options.openReplica()
    do {
        let target = try replica.device(matching: device)
        try await replica.setRole(target.id, to: role)
        print("\(target.name) (\(target.id.shortForm)) is \(role == .admin ? "an admin" : "a member") now; a running node shares it with the group within seconds")
        if let warning = replica.adminWarning { print("note: \(warning)") }
    } catch {
        throw CLIError("\(error)")
    }
}

/// `peersync recovery new`: a new recovery code (the old one stops working).
struct Recovery: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Recovery codes: what enrols a new admin device when every admin device is lost.",
        subcommands: [New.self])

    struct New: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print a new recovery code (admins only); earlier codes stop working. Keep it offline: it makes its holder an admin.")
        @OptionGroup var options: StoreOptions

        func run() async throws {
            let replica = try options.openReplica()
            do {
                let code = try await replica.makeRecoveryCode()
                printRecoveryCode(code)
            } catch {
                throw CLIError("\(error)")
            }
        }
    }
}

/// Prints a recovery code with what to do with it.
func printRecoveryCode(_ code: String) {
    print("recovery code (shown once; earlier codes no longer work):")
    print("  \(code)")
    print("keep it offline (print it, or a password manager): if every admin device is lost, `peersync init --recover CODE` on a new device makes it an admin")
}
