import ArgumentParser
import Foundation
import PeerSync
@_spi(Engine) import PeerSyncCRDT
import ShiftSchedulerModel

/// The running node's status file, if a node is running on this store.
func runningNode(_ options: StoreOptions) -> NodeStatusFile? {
    let path = (options.directory as NSString).appendingPathComponent("node.json")
    guard let data = FileManager.default.contents(atPath: path) else { return nil }
    let decoder = JSONDecoder()
    decoder.dateDecodingStrategy = .iso8601
    guard let status = try? decoder.decode(NodeStatusFile.self, from: data), kill(status.pid, 0) == 0 else { return nil }
    return status
}

struct Status: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Identity, counts, digest, and the running node's peers.")
    @OptionGroup var options: StoreOptions
    @Flag(help: "Print JSON (docs/CLI.md).") var json = false

    struct Output: Codable {
        var replicaID: String
        var deviceID: String
        /// admin, member, "joining" or "removed".
        var role: String
        /// How this device learned it was removed: its roster, or (while a node runs) a peer's refusal.
        var removal: String?
        var groupID: String
        var name: String
        var store: String
        var digest: String
        var records: [String: Int]
        var syncedSettings: Int
        var localSettings: Int
        var conflicts: Int
        var compaction: CompactionOutput
        /// One line when the group depends on a single admin device (nil otherwise).
        var adminWarning: String?
        var node: NodeStatusFile?
    }

    func run() async throws {
        let replica = try options.openReplica()
        let store = replica.store
        let state = store.state
        let roster = replica.roster()
        let node = runningNode(options)
        let removal = await replica.removal?.description ?? node?.removal  // the node's: a peer refused this device as removed
        let role = await replica.pendingJoin != nil ? "joining" : removal != nil ? "removed"
            : roster.role(of: replica.deviceID)?.description ?? "unknown"
        let output = Output(
            replicaID: state.replicaID.description, deviceID: replica.deviceID.humanForm, role: role, removal: removal,
            groupID: replica.groupID.description, name: state.name, store: options.directory,
            digest: state.digest.description, records: try store.visibleCounts().filter { $0.key != RecordKey.syncedSettings.collection && !$0.key.hasPrefix("_") },
            syncedSettings: state.settings(scope: .synced).count, localSettings: state.settings(scope: .local).count,
            conflicts: state.conflicts.entries.count, compaction: CompactionOutput(replica.compactionStatus()),
            adminWarning: replica.adminWarning, node: node)
        if json { return try printJSON(output) }
        print("replica   \(output.replicaID) (\(output.name))")
        print("device    \(output.deviceID) — \(output.role)")
        if let removal = output.removal { print("removed   \(removal)") }
        if let warning = output.adminWarning { print("WARNING   \(warning)") }
        print("store     \(output.store)")
        print("digest    \(output.digest)")
        print("records   " + (output.records.isEmpty ? "none" : output.records.sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }.joined(separator: ", ")))
        print("settings  \(output.syncedSettings) synced, \(output.localSettings) local; conflicts logged: \(output.conflicts)")
        print("storage   " + output.compaction.summary)
        guard let node = output.node else { return print("node      not running (start one with `peersync run`)") }
        print("node      pid \(node.pid), listening on \(node.listen)\(node.insecure ? " — INSECURE" : "")")
        for peer in node.peers {
            let synced = peer.lastConvergedAt.map { "in sync as of \(ISO8601DateFormatter().string(from: $0))" } ?? "syncing"
            print("  peer    \(peer.name) \(peer.replicaID.prefix(8)) at \(peer.address): \(synced)")
        }
        if node.peers.isEmpty { print("  no peers connected") }
        let formatter = ISO8601DateFormatter()
        for relay in node.relays ?? [] {
            var line = "  relay   \(relay.address)" + (relay.relay.map { " (\($0))" } ?? "") + (relay.connected ? ": connected" : ": not connected")
            line += ", last upload " + (relay.lastUpload.map { formatter.string(from: $0) } ?? "never")
            line += ", \(relay.pending) counters pending"
            if relay.refusedBlobs > 0 { line += ", \(relay.refusedBlobs) blobs refused" }
            if let error = relay.lastError, !relay.connected { line += " — \(error)" }
            print(line)
            for withheld in relay.withheld { print("  WITHHELD relay \(relay.relay ?? relay.address) withholds \(withheld)") }
        }
        if let health = node.health {
            print("  health  \(health.repairs) convergence repairs; refused \(health.refusedConnectionsOverAddress) connections over the "
                + "per-address limit, \(health.refusedConnectionsOverTotal) over the total, \(health.refusedSessions) sessions")
            for divergence in health.divergences ?? [] { print("  DIVERGED from \(divergence) — a repair did not heal it") }
            print("  dialing \(health.dialing) of \(health.dialTargets) addresses now (peak \(health.dialingPeak)), "
                + "\(health.rejectedDialTargets) backing off after refusals, \(health.dialAttempts) attempts")
        }
    }
}

/// Compaction as `status --json` and `compact --json` print it (docs/CLI.md).
struct CompactionOutput: Codable {
    struct Holder: Codable {
        var deviceID: String
        var name: String
        var lastSeen: Date?
    }
    /// Deleted records still held (not stable yet).
    var deletedRecords: Int
    var heldBackBy: [Holder]
    var purgedRecords: Int
    var lastRunAt: Date?
    var blocked: String?
    /// The status line ("compaction held back by tablet, last seen 41 days ago").
    var summary: String

    init(_ status: CompactionStatus) {
        deletedRecords = status.deletedRecords
        heldBackBy = status.heldBackBy.map { Holder(deviceID: $0.device.humanForm, name: $0.name, lastSeen: $0.lastSeen) }
        purgedRecords = status.purgedRecords
        lastRunAt = status.lastRunAt
        blocked = status.blocked
        summary = status.summary()
    }
}

struct Compact: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Purge deleted records every device has seen; say what holds the rest back.")
    @OptionGroup var options: StoreOptions
    @Flag(help: "Print JSON (docs/CLI.md).") var json = false

    struct Output: Codable {
        var purgedRecords: Int
        var purgedFields: Int
        var bytesBefore: Int
        var bytesAfter: Int
        var compaction: CompactionOutput
    }

    func run() async throws {
        let replica = try options.openReplica()
        let report = try await replica.compact()
        let run = report.run ?? CompactionRun()
        let output = Output(purgedRecords: run.purgedRecords, purgedFields: run.purgedFields,
                            bytesBefore: report.run == nil ? replica.store.bytesOnDisk() : run.bytesBefore,
                            bytesAfter: report.run == nil ? replica.store.bytesOnDisk() : run.bytesAfter,
                            compaction: CompactionOutput(report.status))
        if json { return try printJSON(output) }
        print("purged    \(output.purgedRecords) deleted records (\(output.purgedFields) fields); store \(output.bytesBefore) → \(output.bytesAfter) bytes")
        print("storage   " + output.compaction.summary)
    }
}

struct Log: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Who changed what, newest last (the store keeps the last 10,000 changes).")
    @OptionGroup var options: StoreOptions
    @Option(help: "How many entries.") var limit = 50
    @Flag(help: "Print JSON (docs/CLI.md).") var json = false

    struct Entry: Codable {
        struct Change: Codable {
            var record: String
            var fields: [String]
            var writer: String
            var timestamp: String
            var deleted: Bool
        }
        var sequence: Int64
        var committedAt: Date
        var origin: String
        var summary: String
        var changes: [Change]?
    }

    func run() async throws {
        let entries = try options.openStore().journal(limit: limit).map { e in
            Entry(sequence: e.sequence, committedAt: Date(timeIntervalSince1970: Double(e.committedAt) / 1000), origin: e.origin,
                  summary: e.summary, changes: e.delta.map { delta in
                      delta.allRecords.sorted { $0.0 < $1.0 }.map { key, state in
                          let writer = state.fields.values.first?.dot.replica ?? state.presence.values.compactMap(\.removedBy).first?.replica
                          return Entry.Change(record: key.description, fields: state.fields.keys.sorted(),
                                              writer: writer?.description ?? "", timestamp: state.maxTimestamp.description,
                                              deleted: state.fields.isEmpty && state.presence.values.contains { !$0.isLive })
                      }
                  })
        }
        if json { return try printJSON(entries) }
        let format = ISO8601DateFormatter()
        for e in entries {
            print("\(e.sequence)  \(format.string(from: e.committedAt))  \(e.origin.padding(toLength: 13, withPad: " ", startingAt: 0))  \(e.summary)")
        }
    }
}

struct Conflicts: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Concurrent overwrites: which value won a field and which lost.")
    @OptionGroup var options: StoreOptions
    @Flag(help: "Print JSON (docs/CLI.md).") var json = false

    struct Entry: Codable {
        struct Value: Codable {
            var value: JSONValue
            var writer: String
            var timestamp: String
        }
        var record: String
        var field: String
        var winner: Value
        var loser: Value
    }

    func run() async throws {
        let entries = try options.openStore().conflicts().map { c in
            Entry(record: c.key.description, field: c.field,
                  winner: .init(value: JSONValue(c.winner.value), writer: c.winner.dot.replica.description, timestamp: c.winner.timestamp.description),
                  loser: .init(value: JSONValue(c.loser.value), writer: c.loser.dot.replica.description, timestamp: c.loser.timestamp.description))
        }
        if json { return try printJSON(entries) }
        if entries.isEmpty { print("no conflicts") }
        for e in entries {
            print("\(e.record) \(e.field): kept \(SettingsCommand.render(e.winner.value.fieldValue)) (\(e.winner.writer.prefix(8))), lost \(SettingsCommand.render(e.loser.value.fieldValue)) (\(e.loser.writer.prefix(8)))")
        }
    }
}

struct Watch: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Print changes as they are committed (by peers through a running node, or other commands).")
    @OptionGroup var options: StoreOptions
    @Flag(help: "One JSON object per line (docs/CLI.md).") var json = false

    struct Line: Codable {
        var sequence: Int64
        var origin: String
        var records: [String]
    }

    func run() async throws {
        let store = try options.openStore()
        if !json { FileHandle.standardOutput.write(Data("watching \(options.directory) (Ctrl-C to stop)\n".utf8)) }
        for try await change in store.externalChanges() {
            let records = change.delta?.allRecords.map(\.0.description).sorted() ?? []
            // Written straight to the file descriptor: a pipe reader sees each change at once.
            if json {
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
                let data = try encoder.encode(Line(sequence: change.sequence, origin: change.origin, records: records))
                FileHandle.standardOutput.write(data + Data("\n".utf8))
            } else {
                FileHandle.standardOutput.write(Data("\(change.origin): \(records.isEmpty ? "many changes (reloaded)" : records.joined(separator: ", "))\n".utf8))
            }
        }
    }
}

struct Export: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Write the visible data as JSON (to stdout, or --output FILE).")
    @OptionGroup var options: StoreOptions
    @Option(help: "File to write.") var output: String?

    func run() async throws {
        let data = try DataExchange.exportData(try options.openStore().state)
        if let output {
            guard FileManager.default.createFile(atPath: output, contents: data + Data("\n".utf8)) else { throw CLIError("cannot write \(output)") }
        } else {
            print(String(decoding: data, as: UTF8.self))
        }
    }
}

struct Import: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Import JSON: a `peersync export`, or ShiftScheduler shiftTypes.json / locations.json. IDs are kept; importing twice changes nothing.")
    @OptionGroup var options: StoreOptions
    @Argument(help: "The JSON file.") var file: String

    func run() async throws {
        let store = try options.openStore()
        guard let data = FileManager.default.contents(atPath: file) else { throw CLIError("cannot read \(file)") }
        var summary = DataExchange.ImportSummary()
        do {
            try store.write { state in
                let (delta, s) = try DataExchange.importData(data, into: &state)
                summary = s
                return delta
            }
        } catch let error as DataExchange.ImportError {
            throw CLIError("\(file): \(error)")
        }
        print("imported \(file): \(summary)")
    }
}
