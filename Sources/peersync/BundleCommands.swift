import ArgumentParser
import Foundation
import PeerSync

/// `peersync bundle create|apply|context`: sync through a file.
struct BundleCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bundle",
        abstract: "Sync through a file (USB stick, mail): exactly what another device lacks, encrypted for the group.",
        discussion: """
            On the device that lacks data: `peersync bundle context -o ctx.psc`. Carry ctx.psc to a \
            device that has the data: `peersync bundle create --for ctx.psc -o update.psb`. Carry \
            update.psb back: `peersync bundle apply update.psb`. Without a context file, \
            `--all` puts everything in the bundle.
            """,
        subcommands: [Create.self, Apply.self, Context.self])

    struct Create: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Write a bundle of what a device lacks.")
        @OptionGroup var options: StoreOptions
        @Option(name: .customLong("for"), help: "The other device's context file (from `peersync bundle context`).")
        var contextFile: String?
        @Flag(help: "Everything this replica holds (for a device whose context you do not have).") var all = false
        @Option(name: .shortAndLong, help: "The bundle file to write.") var output: String

        func validate() throws {
            guard (contextFile == nil) != !all else {
                throw ArgumentParser.ValidationError("give either --for CONTEXT-FILE or --all")
            }
        }

        func run() async throws {
            let replica = try options.openReplica()
            var peer: BundleContext?
            if let contextFile {
                let bytes = try readFile(contextFile)
                do {
                    peer = try replica.readBundleContext(bytes)
                } catch {
                    throw CLIError("\(contextFile): \(error)")
                }
            }
            let bundle: [UInt8]
            do { bundle = try replica.makeBundle(for: peer) } catch { throw CLIError("\(error)") }
            try writeFile(output, bundle)
            let state = replica.state
            let records = peer.map { state.delta(missingFrom: $0.context).recordCount } ?? state.records.recordCount
            print("wrote \(output): \(records) records, \(bundle.count) bytes")
        }
    }

    struct Apply: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Apply a bundle made by another device of the group.")
        @OptionGroup var options: StoreOptions
        @Argument(help: "The bundle file.") var file: String

        func run() async throws {
            let replica = try options.openReplica()
            do {
                let (header, outcome) = try await replica.applyBundle(try readFile(file))
                print("applied \(file) from \(header.senderName) (\(header.sender.deviceID.shortForm)): "
                      + "\(outcome.changedRecords.count) records changed")
            } catch let error as BundleError {
                throw CLIError("\(file): \(error); nothing was applied")
            }
        }
    }

    struct Context: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Write this device's context file (what it has).")
        @OptionGroup var options: StoreOptions
        @Option(name: .shortAndLong, help: "The context file to write.") var output: String

        func run() async throws {
            let replica = try options.openReplica()
            try writeFile(output, replica.bundleContext())
            print("wrote \(output)")
        }
    }
}

func readFile(_ path: String) throws -> [UInt8] {
    guard let data = FileManager.default.contents(atPath: path) else { throw CLIError("cannot read \(path)") }
    return Array(data)
}

func writeFile(_ path: String, _ bytes: [UInt8]) throws {
    guard FileManager.default.createFile(atPath: path, contents: Data(bytes)) else { throw CLIError("cannot write \(path)") }
}
