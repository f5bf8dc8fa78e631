import ArgumentParser
import Foundation
import Logging
import PeerSync
import ShiftSchedulerModel

@main
struct PeerSyncCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "peersync",
        abstract: "Keep shift types, locations and settings in sync between machines on a LAN, with no server.",
        discussion: """
            Every machine holds all the data and works offline; `peersync run` exchanges what \
            the other side lacks whenever peers meet. Start with `peersync init`, then \
            `peersync run` on each machine (see `peersync demo` for a tour).
            """,
        version: PeerSync.version,
        subcommands: [
            Init.self, Join.self, Leave.self, Invite.self, Devices.self, Recovery.self, Run.self, LocationCommand.self, ShiftTypeCommand.self, SettingsCommand.self,
            Status.self, Compact.self, Log.self, Conflicts.self, Watch.self, Export.self, Import.self, BundleCommand.self, Demo.self, Doctor.self,
            Relay.self, Relays.self,
        ]
    )
}

/// `--store DIR`, or `PEERSYNC_STORE`, or `$XDG_DATA_HOME/peersync` (`~/.local/share/peersync`).
struct StoreOptions: ParsableArguments {
    @Option(name: .long, help: "The replica's directory (default: $PEERSYNC_STORE, else $XDG_DATA_HOME/peersync).")
    var store: String?

    var directory: String {
        if let store { return store }
        if let path = ProcessInfo.processInfo.environment["PEERSYNC_STORE"], !path.isEmpty { return path }
        return dataDirectory("peersync")
    }

    func openStore() throws -> ReplicaStore {
        try ReplicaStore.open(directory: directory)
    }

    /// The replica engine over this store: its device key and group (an older store is
    /// upgraded on the way).
    func openReplica(logger: Logger = Logger(label: "peersync")) throws -> Replica {
        try Replica(store: openStore(), directory: directory, logger: logger)
    }
}

/// `$XDG_DATA_HOME/name`, or `~/.local/share/name`.
func dataDirectory(_ name: String) -> String {
    let data = ProcessInfo.processInfo.environment["XDG_DATA_HOME"].flatMap { $0.isEmpty ? nil : $0 }
        ?? (NSHomeDirectory() as NSString).appendingPathComponent(".local/share")
    return (data as NSString).appendingPathComponent(name)
}

/// Encodes `value` as JSON (dates ISO 8601) and puts it at `path` by renaming a temporary file
/// over it, so readers never see half a file (status files `peersync status` and scripts read).
func writeStatusFile<T: Encodable>(_ value: T, to path: String) {
    let encoder = JSONEncoder()
    encoder.dateEncodingStrategy = .iso8601
    guard let data = try? encoder.encode(value) else { return }
    if FileManager.default.createFile(atPath: path + ".tmp", contents: data) {
        _ = rename(path + ".tmp", path)
    }
}

/// An error for a person: printed as one line, exit status 1.
struct CLIError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// Stable JSON for `--json` output (keys sorted, documented in docs/CLI.md). Numbers JSON
/// cannot hold (a stored NaN or infinity) print as the strings "NaN", "Infinity", "-Infinity".
func printJSON<T: Encodable>(_ value: T) throws {
    let encoder = DataExchange.jsonEncoder()
    encoder.dateEncodingStrategy = .iso8601
    print(String(decoding: try encoder.encode(value), as: UTF8.self))
}

func parseUUID(_ text: String, _ what: String) throws -> UUID {
    guard let id = UUID(uuidString: text) else { throw CLIError("\"\(text)\" is not a \(what) ID (expected a UUID)") }
    return id
}

/// `HOST:PORT` (or `[IPv6]:PORT`) as a ``PeerAddress``, with a one-line error otherwise.
func parseHostPort(_ text: String) throws -> PeerAddress {
    do {
        return try PeerAddress(parsing: text)
    } catch {
        throw CLIError("\(error) (write HOST:PORT, e.g. 192.168.1.20:7946)")
    }
}

/// Seconds from "8h", "7h30m", "90m", "45s", "3600" or ISO 8601 "PT8H"; at most
/// ``ShiftType/maximumDuration``.
func parseDuration(_ text: String) throws -> Double {
    let seconds = try parseDurationText(text)
    if let violation = ShiftType.durationViolation(seconds) {
        throw CLIError("invalid duration \"\(text)\": \(violation)")
    }
    return seconds
}

private func parseDurationText(_ text: String) throws -> Double {
    let trimmed = text.trimmingCharacters(in: .whitespaces).lowercased()
    if trimmed.allSatisfy({ $0.isASCII && ($0.isNumber || $0 == ".") }), let seconds = Double(trimmed) { return seconds }
    if trimmed.hasPrefix("p"), let seconds = ISO8601Duration.seconds(trimmed) { return seconds }
    var total = 0.0
    var number = ""
    var sawUnit = false
    for ch in trimmed {
        if ch.isNumber || ch == "." { number.append(ch); continue }
        guard let value = Double(number) else { throw invalidDuration(text) }
        switch ch {
        case "h": total += value * 3_600
        case "m": total += value * 60
        case "s": total += value
        default: throw invalidDuration(text)
        }
        number = ""
        sawUnit = true
    }
    guard sawUnit, number.isEmpty else { throw invalidDuration(text) }
    return total
}

private func invalidDuration(_ text: String) -> CLIError {
    CLIError("invalid duration \"\(text)\": use e.g. 8h, 7h30m, 90m, 3600 (seconds) or PT8H")
}

/// "8h", "7h30m", "45s"; a stored duration that is not valid (NaN, infinite, negative, over
/// ``ShiftType/maximumDuration``) reads "invalid duration (nan)" and is never computed with.
func formatDuration(_ seconds: Double) -> String {
    guard ShiftType.durationViolation(seconds) == nil else { return "invalid duration (\(seconds))" }
    let total = Int(seconds.rounded())  // 0...31,622,400: checked above
    let (h, m, s) = (total / 3600, total % 3600 / 60, total % 60)
    return [h > 0 ? "\(h)h" : "", m > 0 ? "\(m)m" : "", s > 0 || total == 0 ? "\(s)s" : ""].joined()
}
