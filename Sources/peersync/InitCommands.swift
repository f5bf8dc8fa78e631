import ArgumentParser
import Foundation
import PeerSync

struct Init: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Create a replica: a new sync group, or one joining a group with an invite code.")

    @OptionGroup var options: StoreOptions
    @Option(help: "A name people will recognise (default: the host name).") var name: String?
    @Option(help: "Join the group of this invite code (from `peersync invite` on a member).") var join: String?

    func run() async throws {
        // Check everything before writing anything.
        let secret = try join.map { code in
            do { return try GroupSecret(inviteCode: code) } catch { throw CLIError("\(error)") }
        } ?? GroupSecret.generate()
        let store = try ReplicaStore.create(directory: options.directory, name: name ?? ProcessInfo.processInfo.hostName)
        try options.writeSecret(secret)
        print("created replica \(store.replicaID) (\(store.state.name)) in \(options.directory)")
        print(join == nil ? "new sync group; invite other machines with: peersync invite" : "joined the sync group of the invite code")
    }
}

struct Invite: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the invite code other machines use to join this replica's group.")

    @OptionGroup var options: StoreOptions

    func run() async throws {
        _ = try options.openStore()
        print(try options.readSecret().inviteCode)
    }
}
