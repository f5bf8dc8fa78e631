import ArgumentParser
import PeerSync

@main
struct PeerSyncCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "peersync",
        abstract: "Keep shift types, locations and settings in sync between machines on a LAN, with no server.",
        discussion: """
            This build has the data model only; the store, sync sessions and the data commands \
            arrive with the next milestones (see docs/ARCHITECTURE.md).
            """,
        version: PeerSync.version
    )
}
