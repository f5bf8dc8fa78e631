import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel

/// JSON export and import of a replica's visible data.
///
/// Export format (stable; documented in docs/CLI.md):
/// ```json
/// { "format": "peersync-export", "version": 1,
///   "collections": { "locations": [ { "id": "…", "name": "…", "address": "…" } ],
///                    "shiftTypes": [ … ], "<app collection>": [ … ] },
///   "settings": { "weekStart": 1 } }
/// ```
/// Import also accepts ShiftScheduler-style files: `locations.json` (an array of
/// `{id, name, address}`) and `shiftTypes.json` (an array of `{id, symbol, title, description,
/// duration, location}`, `duration` in seconds or an ISO 8601 duration such as `"PT8H"`,
/// `location` an embedded `{id, name, address}` or null). IDs are kept, so importing a file
/// twice changes nothing the second time.
///
/// Numbers JSON cannot hold (NaN, ±infinity) are exported as the strings `"NaN"`,
/// `"Infinity"` and `"-Infinity"`. Import refuses a shift type whose duration is not a number
/// of seconds in 0...``ShiftType/maximumDuration``, naming the entry and the field.
package enum DataExchange {
    public static let formatName = "peersync-export"
    public static let formatVersion: Int64 = 1

    /// What an import did.
    package struct ImportSummary: Equatable, Sendable, CustomStringConvertible {
        public var created = 0
        public var updated = 0
        public var unchanged = 0
        public var settingsChanged = 0

        public init(created: Int = 0, updated: Int = 0, unchanged: Int = 0, settingsChanged: Int = 0) {
            self.created = created
            self.updated = updated
            self.unchanged = unchanged
            self.settingsChanged = settingsChanged
        }

        public var description: String {
            "\(created) created, \(updated) updated, \(unchanged) unchanged" + (settingsChanged > 0 ? ", \(settingsChanged) settings" : "")
        }
    }

    /// Why a file cannot be imported; `description` names the entry.
    package struct ImportError: Error, Equatable, CustomStringConvertible {
        public let description: String
        init(_ description: String) { self.description = description }
    }

    // MARK: Export

    public static func export(_ state: ReplicaState) -> JSONValue {
        var collections: [String: JSONValue] = [:]
        for (collection, records) in state.records.collections where collection != RecordKey.syncedSettings.collection {
            let visible = records.filter { $0.value.isVisible }.sorted { $0.key.uuidString < $1.key.uuidString }
            if visible.isEmpty { continue }
            collections[collection] = .array(visible.map { id, record in
                var object = record.values.mapValues(JSONValue.init)
                object["id"] = .string(id.uuidString)
                return .object(object)
            })
        }
        return .object([
            "format": .string(formatName),
            "version": .int(formatVersion),
            "collections": .object(collections),
            "settings": .object(state.settings(scope: .synced).mapValues(JSONValue.init)),
        ])
    }

    /// Pretty, key-sorted JSON bytes of ``export(_:)``.
    public static func exportData(_ state: ReplicaState) throws -> Data {
        try jsonEncoder().encode(export(state))
    }

    /// The encoder of exports and of the CLI's `--json` output: pretty, keys sorted, and
    /// non-finite numbers as the strings `"NaN"`, `"Infinity"`, `"-Infinity"` (JSON has no
    /// form for them; a stored NaN must not make an export or a listing fail).
    public static func jsonEncoder() -> JSONEncoder {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys, .withoutEscapingSlashes]
        encoder.nonConformingFloatEncodingStrategy = .convertToString(positiveInfinity: "Infinity", negativeInfinity: "-Infinity", nan: "NaN")
        return encoder
    }

    // MARK: Import

    /// Parses `data` and applies it to `state` as local writes. Returns the joined delta (nil if
    /// nothing changed) and a summary. Throws before changing anything if any entry is invalid.
    public static func importData(_ data: Data, into state: inout ReplicaState) throws(ImportError) -> (RecordMap?, ImportSummary) {
        let json: JSONValue
        do {
            json = try JSONDecoder().decode(JSONValue.self, from: data)
        } catch {
            throw ImportError("not valid JSON (\(Self.describe(error)))")
        }
        let plan = try plan(json)
        var summary = ImportSummary()
        var delta: RecordMap?
        var scratch = state
        for (key, incoming) in plan.records {
            let existed = scratch.contains(key)
            // JSON has one number type: an integer that equals a stored double is the same value.
            let stored = scratch.records.record(key)?.values ?? [:]
            let fields = incoming.reduce(into: [String: FieldValue]()) { out, pair in
                if case .int(let i) = pair.value, case .double(let d)? = stored[pair.key], Double(i) == d {
                    out[pair.key] = .double(d)
                } else if case .string(let text) = pair.value, case .uuid(let id)? = stored[pair.key], UUID(uuidString: text) == id {
                    out[pair.key] = .uuid(id)
                } else {
                    out[pair.key] = pair.value
                }
            }
            if let d = scratch.upsert(fields, to: key) {
                join(d, into: &delta)
                if existed { summary.updated += 1 } else { summary.created += 1 }
            } else {
                summary.unchanged += 1
            }
        }
        for (key, value) in plan.settings.sorted(by: { $0.key < $1.key }) {
            if let d = scratch.setSetting(key, to: value, scope: .synced) {
                join(d, into: &delta)
                summary.settingsChanged += 1
            }
        }
        if let failure = scratch.localChangeFailure { throw ImportError("\(failure)") }
        state = scratch
        return (delta, summary)
    }

    /// Joins in place: `merged(with:)` would copy the growing delta once per entry, which made
    /// a 20,000-entry import quadratic.
    static func join(_ d: RecordMap, into delta: inout RecordMap?) {
        if delta == nil { delta = d } else { delta!.merge(d) }
    }

    struct Plan {
        var records: [(RecordKey, [String: FieldValue])] = []
        var settings: [String: FieldValue] = [:]
    }

    static func plan(_ json: JSONValue) throws(ImportError) -> Plan {
        var plan = Plan()
        switch json {
        case .object(let root):
            guard root["format"] == .string(formatName) else {
                throw ImportError("unknown JSON document: expected a PeerSync export (\"format\": \"\(formatName)\") or a ShiftScheduler array")
            }
            guard case .int(let version)? = root["version"], version <= formatVersion else {
                throw ImportError("export version \(root["version"].map { "\($0)" } ?? "missing") is newer than this peersync understands (\(formatVersion))")
            }
            if case .object(let collections)? = root["collections"] {
                for (collection, entries) in collections.sorted(by: { $0.key < $1.key }) {
                    guard case .array(let items) = entries else { throw ImportError("collection \(collection) is not an array") }
                    for (index, item) in items.enumerated() {
                        let (id, object) = try identified(item, "\(collection)[\(index)]")
                        var fields = object.mapValues(\.fieldValue)
                        fields["id"] = nil
                        if collection == ShiftType.collection, let duration = object["duration"] {
                            _ = try number(duration, "\(collection)[\(index)].duration")
                        }
                        plan.records.append((RecordKey(collection: collection, id: id), fields))
                    }
                }
            }
            if case .object(let settings)? = root["settings"] {
                plan.settings = settings.mapValues(\.fieldValue)
            }
        case .array(let items):
            for (index, item) in items.enumerated() {
                let (id, object) = try identified(item, "entry \(index)")
                if object["symbol"] != nil || object["duration"] != nil {
                    try planShiftType(id, object, "entry \(index)", into: &plan)
                } else {
                    plan.records.append((RecordKey(collection: Location.collection, id: id), try locationFields(object, "entry \(index)")))
                }
            }
        default:
            throw ImportError("expected a JSON object (PeerSync export) or array (ShiftScheduler file)")
        }
        return plan
    }

    static func planShiftType(_ id: UUID, _ object: [String: JSONValue], _ place: String, into plan: inout Plan) throws(ImportError) {
        var fields: [String: FieldValue] = [:]
        guard case .string(let symbol)? = object["symbol"] else { throw ImportError("\(place): shift type needs a \"symbol\" string") }
        fields["symbol"] = .string(symbol)
        fields["title"] = .string(try optionalString(object["title"], "\(place).title") ?? symbol)
        fields["description"] = .string(try optionalString(object["description"], "\(place).description") ?? "")
        guard let duration = object["duration"] else { throw ImportError("\(place): shift type needs a \"duration\"") }
        fields["duration"] = .double(try seconds(duration, "\(place).duration"))
        var locationID: FieldValue = .null
        switch object["location"] {
        case nil, .null?: break
        case .object(let location)?:
            let (locID, locObject) = try identified(.object(location), "\(place).location")
            plan.records.append((RecordKey(collection: Location.collection, id: locID), try locationFields(locObject, "\(place).location")))
            locationID = .uuid(locID)
        default: throw ImportError("\(place).location must be an object or null")
        }
        if case .string(let text)? = object["locationID"] ?? object["locationId"] {
            guard let ref = UUID(uuidString: text) else { throw ImportError("\(place).locationID is not a UUID") }
            locationID = .uuid(ref)
        }
        fields["locationID"] = locationID
        plan.records.append((RecordKey(collection: ShiftType.collection, id: id), fields))
    }

    static func locationFields(_ object: [String: JSONValue], _ place: String) throws(ImportError) -> [String: FieldValue] {
        guard case .string(let name)? = object["name"] else { throw ImportError("\(place): location needs a \"name\" string") }
        return ["name": .string(name), "address": .string(try optionalString(object["address"], "\(place).address") ?? "")]
    }

    static func identified(_ item: JSONValue, _ place: String) throws(ImportError) -> (UUID, [String: JSONValue]) {
        guard case .object(let object) = item else { throw ImportError("\(place) is not an object") }
        guard case .string(let text)? = object["id"] else { throw ImportError("\(place) has no \"id\" string") }
        guard let id = UUID(uuidString: text) else { throw ImportError("\(place).id \"\(text)\" is not a UUID") }
        return (id, object)
    }

    static func optionalString(_ value: JSONValue?, _ place: String) throws(ImportError) -> String? {
        switch value {
        case nil, .null?: return nil
        case .string(let s)?: return s
        default: throw ImportError("\(place) must be a string")
        }
    }

    /// A shift duration in seconds, from a number or an ISO 8601 duration string.
    static func seconds(_ value: JSONValue, _ place: String) throws(ImportError) -> Double {
        guard case .string(let text) = value else { return try number(value, place) }
        guard let seconds = ISO8601Duration.seconds(text) else {
            throw ImportError("\(place) \"\(text)\" is not an ISO 8601 duration such as PT8H or PT7H30M")
        }
        if let violation = ShiftType.durationViolation(seconds) {
            throw ImportError("\(place) \"\(text)\" is not a valid duration: \(violation)")
        }
        return seconds
    }

    /// A shift duration given as a number of seconds.
    static func number(_ value: JSONValue, _ place: String) throws(ImportError) -> Double {
        let seconds: Double
        switch value {
        case .int(let v): seconds = Double(v)
        case .double(let v): seconds = v
        default: throw ImportError("\(place) must be seconds (a number from 0 to \(Int(ShiftType.maximumDuration))) or an ISO 8601 duration string")
        }
        if let violation = ShiftType.durationViolation(seconds) {
            throw ImportError("\(place) \(value.numberText) is not a valid duration: \(violation)")
        }
        return seconds
    }

    static func describe(_ error: any Error) -> String {
        if case DecodingError.dataCorrupted(let context) = error {
            return context.underlyingError.map { "\($0)" } ?? context.debugDescription
        }
        return "\(error)"
    }
}

/// ISO 8601 durations with fixed-length units: `PnW`, `PnDTnHnMnS` (fractions allowed on the last
/// unit). Years and months have no fixed length in seconds and are refused.
package enum ISO8601Duration {
    public static func seconds(_ text: String) -> Double? {
        var rest = Substring(text.uppercased())
        guard rest.popFirst() == "P", !rest.isEmpty else { return nil }
        var total = 0.0
        var inTime = false
        var number = ""
        var sawUnit = false
        for ch in rest {
            if ch == "T" {
                guard !inTime, number.isEmpty else { return nil }
                inTime = true
                continue
            }
            if ch.isNumber || ch == "." || ch == "," {
                number.append(ch == "," ? "." : ch)
                continue
            }
            guard let value = Double(number) else { return nil }
            number = ""
            let unit: Double
            switch (inTime, ch) {
            case (false, "W"): unit = 7 * 86_400
            case (false, "D"): unit = 86_400
            case (true, "H"): unit = 3_600
            case (true, "M"): unit = 60
            case (true, "S"): unit = 1
            default: return nil
            }
            total += value * unit
            sawUnit = true
        }
        guard number.isEmpty, sawUnit else { return nil }
        return total
    }
}
