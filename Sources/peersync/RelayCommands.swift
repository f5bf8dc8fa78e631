import ArgumentParser
import Foundation
import Logging
import PeerSync
import PeerSyncIdentity
import PeerSyncNetwork
import PeerSyncRelay
import ServiceLifecycle

/// `peersync relay`: run a relay for any number of groups (docs/RELAY.md).
struct Relay: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run a relay: stores and forwards sealed data for groups whose devices never meet (docs/RELAY.md).",
        subcommands: [Serve.self, Code.self], defaultSubcommand: Serve.self)

    struct RelayStoreOptions: ParsableArguments {
        @Option(name: .long, help: "The relay's directory: its key, enrolment secret and database (default: $XDG_DATA_HOME/peersync-relay).")
        var store: String?

        var directory: String { store ?? dataDirectory("peersync-relay") }

        /// The relay's device key and enrolment secret, made on first use.
        func identity() throws -> (key: DeviceKey, secret: [UInt8]) {
            do {
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true,
                                                        attributes: [.posixPermissions: 0o700])
            } catch {
                throw CLIError("cannot create the relay directory \(directory): \(error.localizedDescription)")
            }
            let key: DeviceKey
            do {
                key = try DeviceKey.loadOrCreate(at: directory + "/relay.key").key
            } catch {
                throw CLIError("\(error)")
            }
            let secretPath = directory + "/enrol.secret"
            if let data = FileManager.default.contents(atPath: secretPath) {
                guard data.count == 16 else { throw CLIError("\(secretPath) is damaged (\(data.count) bytes, expected 16); delete it to make a new enrolment code") }
                return (key, [UInt8](data))
            }
            let secret = RelayService.makeSecret()
            guard FileManager.default.createFile(atPath: secretPath, contents: Data(secret), attributes: [.posixPermissions: 0o600]) else {
                throw CLIError("cannot write \(secretPath)")
            }
            return (key, secret)
        }
    }

    struct Serve: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "serve",
            abstract: "Serve until SIGINT or SIGTERM (the default subcommand).",
            discussion: """
                Prints the relay code once: an admin enrols the relay in a group with \
                `peersync relays add HOST:PORT CODE`. The relay holds only sealed data: it never \
                sees record IDs, collections, field names, values or device names.
                """)
        @OptionGroup var options: RelayStoreOptions
        @Option(help: "Address to listen on.") var listen: String = "0.0.0.0:7947"
        @Option(help: "Bytes stored per group; uploads beyond are refused (nothing stored is lost).")
        var groupBytes = SyncLimits().relayGroupBytes
        @Option(help: "Blobs stored per group.") var groupBlobs = SyncLimits().relayGroupBlobs
        @Option(help: "Connections per group at once.") var groupConnections = SyncLimits().relayGroupConnections
        @Option(help: "Groups this relay serves.") var maxGroups = SyncLimits().relayGroups
        @Option(help: "Connections at once, strangers included.") var maxConnections = SyncLimits().relayConnections
        @Option(help: "Connections at once from one IP address (closed on arrival beyond, before TLS).")
        var maxConnectionsPerAddress = SyncLimits().relayConnectionsPerAddress
        @Option(help: "trace, debug, info, notice, warning, error or critical.") var logLevel: String = "info"

        func validate() throws {
            for (name, value) in [("--group-bytes", groupBytes), ("--group-blobs", groupBlobs), ("--group-connections", groupConnections),
                                  ("--max-groups", maxGroups), ("--max-connections", maxConnections),
                                  ("--max-connections-per-address", maxConnectionsPerAddress)] where value < 1 {
                throw ValidationError("\(name) must be at least 1, got \(value)")
            }
        }

        func run() async throws {
            guard let level = Logger.Level(rawValue: logLevel) else { throw CLIError("unknown log level \"\(logLevel)\"") }
            let address = try parseHostPort(listen)
            LoggingSystem.bootstrap { label in
                var handler = StreamLogHandler.standardError(label: label)
                handler.logLevel = level
                return handler
            }
            let logger = Logger(label: "peersync.relay")
            let (key, secret) = try options.identity()
            var limits = SyncLimits()
            limits.relayGroupBytes = groupBytes
            limits.relayGroupBlobs = groupBlobs
            limits.relayGroupConnections = groupConnections
            limits.relayGroups = maxGroups
            limits.relayConnections = maxConnections
            limits.relayConnectionsPerAddress = maxConnectionsPerAddress
            let storage: SQLiteRelayStorage
            do {
                storage = try SQLiteRelayStorage(path: options.directory + "/relay.sqlite")
            } catch {
                throw CLIError("cannot open the relay's database in \(options.directory): \(error)")
            }
            let service = try RelayService(key: key, enrolSecret: secret, storage: storage, limits: limits, logger: logger)
            let server = try RelayServer(service: service, listen: address, limits: limits, logger: logger)
            let port: UInt16
            do {
                port = try await server.start()
            } catch {
                throw CLIError("cannot listen on \(listen): \(error)")
            }
            // Unbuffered (scripts read it from a pipe while the relay runs).
            FileHandle.standardOutput.write(Data("""
                relay \(key.deviceID.humanForm) listening on \(address.host):\(port)
                enrol it in a group (on an admin's device): peersync relays add HOST:\(port) \(service.code)

                """.utf8))
            let status = RelayStatusWriter(service: service, path: options.directory + "/relay.json",
                                           listen: "\(address.host):\(port)")
            let group = ServiceGroup(services: [status], gracefulShutdownSignals: [.sigterm, .sigint], cancellationSignals: [], logger: logger)
            try await group.run()
            await server.stop()
        }
    }

    struct Code: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Print the code an admin needs to enrol this relay in a group.")
        @OptionGroup var options: RelayStoreOptions

        func run() async throws {
            let (key, secret) = try options.identity()
            print(RelayCode(relay: key.deviceID, secret: secret))
        }
    }
}

/// What `peersync relay` writes to DIR/relay.json every half second (docs/CLI.md).
struct RelayStatusFile: Codable {
    var pid: Int32
    var listen: String
    var updatedAt: Date
    var groups: Int
    var connections: Int
    var blobs: Int
    var bytes: Int
    var uploads: Int
    var forwarded: Int
    var refusedConnections: Int
}

struct RelayStatusWriter: Service {
    let service: RelayService
    let path: String
    let listen: String

    func run() async throws {
        await cancelWhenGracefulShutdown {
            while !Task.isCancelled {
                let figures = await service.counts()
                let file = RelayStatusFile(pid: getpid(), listen: listen, updatedAt: Date(), groups: figures.groups,
                                           connections: figures.connections, blobs: figures.blobs, bytes: figures.bytes,
                                           uploads: figures.uploads, forwarded: figures.forwarded,
                                           refusedConnections: figures.refusedConnections)
                writeStatusFile(file, to: path)
                try? await Task.sleep(for: .milliseconds(500))
            }
        }
        try? FileManager.default.removeItem(atPath: path)
    }
}

/// `peersync relays`: the group's relays (enrol, remove, list).
struct Relays: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "The group's relays: add (enrol) one, remove one, list them (docs/RELAY.md).",
        subcommands: [List.self, Add.self, Remove.self], defaultSubcommand: List.self)

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "list", abstract: "Relays the roster names.")
        @OptionGroup var options: StoreOptions

        func run() async throws {
            let replica = try options.openReplica()
            let relays = replica.roster().devices.values.filter { $0.role == .relay }.sorted { $0.name < $1.name }
            if relays.isEmpty { print("no relays (an admin enrols one: peersync relays add HOST:PORT CODE)") }
            for relay in relays {
                print("\(relay.id.humanForm)  \(relay.name)\(relay.isActive ? "" : ", REMOVED")")
            }
        }
    }

    struct Add: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Enrol a relay in the group (admins only), with the code `peersync relay` printed.",
            discussion: "Then run devices with `peersync run --relay HOST:PORT`.")
        @OptionGroup var options: StoreOptions
        @Argument(help: "Where the relay listens, HOST:PORT.") var address: String
        @Argument(help: "The relay's code (PSL-…).") var code: String

        func run() async throws {
            let target = try parseHostPort(address)
            let replica = try options.openReplica()
            do {
                let relay = try await replica.enrolRelay(at: target, code: code)
                print("enrolled relay \(relay) at \(target); run devices with `peersync run --relay \(target)`")
            } catch {
                throw CLIError("\(error)")
            }
            await replica.close()
        }
    }

    struct Remove: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Remove a relay from the group (admins only): it is refused, and forgets the group's data when an admin's node next reaches it.")
        @OptionGroup var options: StoreOptions
        @Argument(help: "The relay's device ID (or a unique prefix) from `peersync relays`.") var relay: String

        func run() async throws {
            let replica = try options.openReplica()
            do {
                let target = try replica.device(matching: relay)
                guard target.role == .relay else { throw CLIError("\(target.name) (\(target.id.shortForm)) is not a relay; see `peersync devices remove`") }
                try await replica.removeDevice(target.id)
                print("removed \(target.name) (\(target.id.shortForm)); it forgets the group's data when an admin's node next reaches it")
            } catch let error as CLIError {
                throw error
            } catch {
                throw CLIError("\(error)")
            }
        }
    }
}
