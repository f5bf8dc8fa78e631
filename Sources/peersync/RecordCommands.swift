import ArgumentParser
import Foundation
import PeerSync
import ShiftSchedulerModel

/// Applies a change to the store as one transaction (the running node, if any, ships it).
func commit(_ store: ReplicaStore, _ body: (inout ReplicaState) throws -> RecordMap?) throws {
    try store.write(body)
}

struct LocationJSON: Codable {
    var id: String
    var name: String
    var address: String
    init(_ l: Location) { id = l.id.uuidString; name = l.name; address = l.address }
}

/// A shift type in `--json` output (docs/CLI.md). A stored duration that is not valid
/// (NaN, infinite, negative, over 366 days) has `durationSeconds` null and
/// `invalidDuration` the stored value as text ("nan", "inf", "-5.0", "1e+300").
struct ShiftTypeJSON: Encodable {
    var id: String
    var symbol: String
    var title: String
    var description: String
    var durationSeconds: Double?
    var invalidDuration: String?
    var locationID: String?
    init(_ s: ShiftType) {
        id = s.id.uuidString; symbol = s.symbol; title = s.title; description = s.description
        locationID = s.locationID?.uuidString
        if s.hasValidDuration { durationSeconds = s.duration } else { invalidDuration = "\(s.duration)" }
    }

    enum CodingKeys: String, CodingKey { case id, symbol, title, description, durationSeconds, invalidDuration, locationID }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(id, forKey: .id)
        try container.encode(symbol, forKey: .symbol)
        try container.encode(title, forKey: .title)
        try container.encode(description, forKey: .description)
        try container.encode(durationSeconds, forKey: .durationSeconds)  // null when invalid
        try container.encodeIfPresent(invalidDuration, forKey: .invalidDuration)
        try container.encode(locationID, forKey: .locationID)
    }
}

struct LocationCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "location", abstract: "Add, change, remove and list locations.",
        subcommands: [Add.self, Set.self, Remove.self, List.self, Show.self])

    struct Add: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Add a location; prints its ID.")
        @OptionGroup var options: StoreOptions
        @Option(help: "Name.") var name: String
        @Option(help: "Address.") var address: String = ""
        @Option(help: "Use this ID instead of a new one.") var id: String?

        func run() async throws {
            let store = try options.openStore()
            let location = Location(id: try id.map { try parseUUID($0, "location") } ?? UUID(), name: name, address: address)
            if store.state.contains(location.recordKey) { throw CLIError("a location with ID \(location.id) already exists") }
            try commit(store) { try $0.save(location) }
            print(location.id.uuidString)
        }
    }

    struct Set: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Change fields of a location.")
        @OptionGroup var options: StoreOptions
        @Argument(help: "The location's ID.") var id: String
        @Option(help: "New name.") var name: String?
        @Option(help: "New address.") var address: String?

        func run() async throws {
            let store = try options.openStore()
            let id = try parseUUID(id, "location")
            guard name != nil || address != nil else { throw CLIError("nothing to change: pass --name and/or --address") }
            try commit(store) { state in
                guard var location = try state.fetch(Location.self, id: id) else { throw CLIError("no location with ID \(id)") }
                if let name { location.name = name }
                if let address { location.address = address }
                return try state.save(location)
            }
        }
    }

    struct Remove: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "rm", abstract: "Remove a location (shift types there then have no location).")
        @OptionGroup var options: StoreOptions
        @Argument(help: "The location's ID.") var id: String

        func run() async throws {
            let store = try options.openStore()
            let id = try parseUUID(id, "location")
            try commit(store) { state in
                guard let delta = state.delete(Location.self, id: id) else { throw CLIError("no location with ID \(id)") }
                return delta
            }
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List locations, by name.")
        @OptionGroup var options: StoreOptions
        @Flag(help: "Print JSON (docs/CLI.md).") var json = false

        func run() async throws {
            let locations = try options.openStore().state.fetchAll(Location.self).sorted { ($0.name, $0.id.uuidString) < ($1.name, $1.id.uuidString) }
            if json { return try printJSON(locations.map(LocationJSON.init)) }
            for l in locations { print("\(l.id.uuidString)  \(l.name)\(l.address.isEmpty ? "" : "  (\(l.address))")") }
        }
    }

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Show one location.")
        @OptionGroup var options: StoreOptions
        @Argument(help: "The location's ID.") var id: String
        @Flag(help: "Print JSON (docs/CLI.md).") var json = false

        func run() async throws {
            let id = try parseUUID(id, "location")
            guard let l = try options.openStore().state.fetch(Location.self, id: id) else { throw CLIError("no location with ID \(id)") }
            if json { return try printJSON(LocationJSON(l)) }
            print("id:      \(l.id.uuidString)\nname:    \(l.name)\naddress: \(l.address)")
        }
    }
}

struct ShiftTypeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "shift-type", abstract: "Add, change, remove and list shift types.",
        subcommands: [Add.self, Set.self, Remove.self, List.self, Show.self])

    static func location(_ text: String?, in state: ReplicaState) throws -> UUID?? {
        guard let text else { return .none }
        if text.isEmpty || text == "none" { return .some(nil) }
        let id = try parseUUID(text, "location")
        guard state.contains(RecordKey(collection: Location.collection, id: id)) else { throw CLIError("no location with ID \(id)") }
        return .some(id)
    }

    struct Add: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Add a shift type; prints its ID.")
        @OptionGroup var options: StoreOptions
        @Option(help: "Short mark, 1–3 characters.") var symbol: String
        @Option(help: "Title.") var title: String
        @Option(help: "Description.") var description: String = ""
        @Option(help: "Length: 8h, 7h30m, 90m, 3600 (seconds) or PT8H.") var duration: String
        @Option(help: "ID of the location.") var location: String?
        @Option(help: "Use this ID instead of a new one.") var id: String?

        func run() async throws {
            let store = try options.openStore()
            let seconds = try parseDuration(duration)
            let newID = try id.map { try parseUUID($0, "shift type") } ?? UUID()
            try commit(store) { state in
                if state.contains(RecordKey(collection: ShiftType.collection, id: newID)) {
                    throw CLIError("a shift type with ID \(newID) already exists")
                }
                let locationID = try ShiftTypeCommand.location(location, in: state) ?? nil
                return try state.save(ShiftType(id: newID, symbol: symbol, title: title, description: description,
                                                duration: seconds, locationID: locationID))
            }
            print(newID.uuidString)
        }
    }

    struct Set: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Change fields of a shift type.")
        @OptionGroup var options: StoreOptions
        @Argument(help: "The shift type's ID.") var id: String
        @Option(help: "New symbol.") var symbol: String?
        @Option(help: "New title.") var title: String?
        @Option(help: "New description.") var description: String?
        @Option(help: "New length (8h, 7h30m, 90m, 3600, PT8H).") var duration: String?
        @Option(help: "New location ID, or \"none\".") var location: String?

        func run() async throws {
            let store = try options.openStore()
            let id = try parseUUID(id, "shift type")
            let seconds = try duration.map(parseDuration)
            guard symbol != nil || title != nil || description != nil || duration != nil || location != nil else {
                throw CLIError("nothing to change: pass at least one of --symbol --title --description --duration --location")
            }
            try commit(store) { state in
                guard var shift = try state.fetch(ShiftType.self, id: id) else { throw CLIError("no shift type with ID \(id)") }
                if let symbol { shift.symbol = symbol }
                if let title { shift.title = title }
                if let description { shift.description = description }
                if let seconds { shift.duration = seconds }
                let newLocation = try ShiftTypeCommand.location(location, in: state)
                if let newLocation { shift.locationID = newLocation }
                guard case .some(.none) = newLocation else { return try state.save(shift) }
                // An explicit "none" detaches even from a removed location, whose link reads as
                // none and which `save` therefore leaves stored (it returns if the location does).
                var fields = try FieldEncoder().encodeFields(shift)
                fields["id"] = nil
                return state.upsert(fields, to: shift.recordKey)
            }
        }
    }

    struct Remove: AsyncParsableCommand {
        static let configuration = CommandConfiguration(commandName: "rm", abstract: "Remove a shift type.")
        @OptionGroup var options: StoreOptions
        @Argument(help: "The shift type's ID.") var id: String

        func run() async throws {
            let store = try options.openStore()
            let id = try parseUUID(id, "shift type")
            try commit(store) { state in
                guard let delta = state.delete(ShiftType.self, id: id) else { throw CLIError("no shift type with ID \(id)") }
                return delta
            }
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List shift types, by symbol.")
        @OptionGroup var options: StoreOptions
        @Flag(help: "Print JSON (docs/CLI.md).") var json = false

        func run() async throws {
            let state = try options.openStore().state
            let shifts = try state.fetchAll(ShiftType.self).sorted { ($0.symbol, $0.id.uuidString) < ($1.symbol, $1.id.uuidString) }
            if json { return try printJSON(shifts.map(ShiftTypeJSON.init)) }
            for s in shifts {
                let place = try s.locationID.flatMap { try state.fetch(Location.self, id: $0)?.name }.map { "  @ \($0)" } ?? ""
                print("\(s.id.uuidString)  \(s.symbol.padding(toLength: 3, withPad: " ", startingAt: 0))  \(s.title)  \(formatDuration(s.duration))\(place)")
            }
        }
    }

    struct Show: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Show one shift type.")
        @OptionGroup var options: StoreOptions
        @Argument(help: "The shift type's ID.") var id: String
        @Flag(help: "Print JSON (docs/CLI.md).") var json = false

        func run() async throws {
            let id = try parseUUID(id, "shift type")
            let state = try options.openStore().state
            guard let s = try state.fetch(ShiftType.self, id: id) else { throw CLIError("no shift type with ID \(id)") }
            if json { return try printJSON(ShiftTypeJSON(s)) }
            let place = try s.locationID.flatMap { try state.fetch(Location.self, id: $0) }
            print("""
                id:          \(s.id.uuidString)
                symbol:      \(s.symbol)
                title:       \(s.title)
                description: \(s.description)
                duration:    \(formatDuration(s.duration))
                location:    \(place.map { "\($0.name) (\($0.id.uuidString))" } ?? "none")
                """)
        }
    }
}

struct SettingsCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "settings", abstract: "Synced settings (all machines) and, with --local, this machine's own.",
        subcommands: [Set.self, Get.self, Unset.self, List.self])

    struct Scope: ParsableArguments {
        @Flag(help: "This machine only (never synced).") var local = false
        var scope: SettingScope { local ? .local : .synced }
    }

    /// A JSON literal (number, true/false, null, "string") if the text is one, else the text.
    static func parseValue(_ text: String) -> FieldValue {
        if let json = try? JSONDecoder().decode(JSONValue.self, from: Data(text.utf8)) { return json.fieldValue }
        return .string(text)
    }

    static func render(_ value: FieldValue) -> String {
        if case .string(let s) = value { return s }
        let data = (try? JSONEncoder().encode(JSONValue(value))) ?? Data()
        return String(decoding: data, as: UTF8.self)
    }

    struct Set: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Set a setting (VALUE is JSON if it parses as JSON, else text).")
        @OptionGroup var options: StoreOptions
        @OptionGroup var scope: Scope
        @Argument var key: String
        @Argument var value: String

        func run() async throws {
            let store = try options.openStore()
            try commit(store) { $0.setSetting(key, to: SettingsCommand.parseValue(value), scope: scope.scope) }
        }
    }

    struct Get: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Print a setting's value.")
        @OptionGroup var options: StoreOptions
        @OptionGroup var scope: Scope
        @Argument var key: String
        @Flag(help: "Print JSON.") var json = false

        func run() async throws {
            guard let value = try options.openStore().state.setting(key, scope: scope.scope) else {
                throw CLIError("setting \(key) is not set\(scope.local ? " on this machine" : "")")
            }
            if json { return try printJSON(JSONValue(value)) }
            print(SettingsCommand.render(value))
        }
    }

    struct Unset: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Remove a setting.")
        @OptionGroup var options: StoreOptions
        @OptionGroup var scope: Scope
        @Argument var key: String

        func run() async throws {
            let store = try options.openStore()
            try commit(store) { $0.setSetting(key, to: nil, scope: scope.scope) }
        }
    }

    struct List: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List settings of one scope.")
        @OptionGroup var options: StoreOptions
        @OptionGroup var scope: Scope
        @Flag(help: "Print JSON.") var json = false

        func run() async throws {
            let settings = try options.openStore().state.settings(scope: scope.scope)
            if json { return try printJSON(settings.mapValues(JSONValue.init)) }
            for (key, value) in settings.sorted(by: { $0.key < $1.key }) { print("\(key) = \(SettingsCommand.render(value))") }
        }
    }
}
