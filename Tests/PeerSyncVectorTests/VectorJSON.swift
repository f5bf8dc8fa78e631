import Foundation
@_spi(Engine) import PeerSyncCRDT

// The JSON forms of the test vectors (docs/vectors/README.md). Numbers that can exceed 2⁵³
// are decimal strings; byte strings are lowercase hex.

typealias JSON = [String: Any]

func hex(_ bytes: some Sequence<UInt8>) -> String {
    bytes.map { String(format: "%02x", $0) }.joined()
}

func unhex(_ text: Any?) -> [UInt8] {
    guard let text = text as? String else { return [] }
    var out: [UInt8] = []
    var index = text.startIndex
    while index < text.endIndex {
        let next = text.index(index, offsetBy: 2)
        out.append(UInt8(text[index..<next], radix: 16)!)
        index = next
    }
    return out
}

/// A JSON number for values up to 2⁵³, a decimal string above.
func num(_ value: UInt64) -> Any { value <= 1 << 53 ? Int(value) : String(value) }

func u64(_ any: Any?) -> UInt64 {
    if let text = any as? String { return UInt64(text)! }
    if let number = any as? NSNumber { return number.uint64Value }
    if let int = any as? Int { return UInt64(int) }
    fatalError("not a number: \(String(describing: any))")
}

func replicaHex(_ id: ReplicaID) -> String { id.description }
func replica(_ any: Any?) -> ReplicaID { ReplicaID(hex: any as! String)! }
func uuid(_ any: Any?) -> UUID { UUID(uuidString: any as! String)! }
func uuidText(_ id: UUID) -> String { id.uuidString.lowercased() }

// MARK: - Values

func valueJSON(_ value: FieldValue) -> Any {
    switch value {
    case .null: return ["null": true]
    case .bool(let b): return ["bool": b]
    case .int(let i): return ["int": String(i)]
    case .double(let d): return ["double": String(format: "%016llx", d.bitPattern), "approx": "\(d)"]
    case .string(let s): return ["string": s]
    case .bytes(let b): return ["bytes": hex(b)]
    case .list(let items): return ["list": items.map(valueJSON)]
    case .map(let entries): return ["map": entries.mapValues(valueJSON)]
    case .uuid(let id): return ["uuid": uuidText(id)]
    }
}

func parseValue(_ any: Any?) -> FieldValue {
    let object = any as! JSON
    if object["null"] != nil { return .null }
    if let b = object["bool"] as? Bool { return .bool(b) }
    if let i = object["int"] as? String { return .int(Int64(i)!) }
    if let d = object["double"] as? String { return .double(Double(bitPattern: UInt64(d, radix: 16)!)) }
    if let s = object["string"] as? String { return .string(s) }
    if let b = object["bytes"] { return .bytes(unhex(b)) }
    if let l = object["list"] as? [Any] { return .list(l.map(parseValue)) }
    if let m = object["map"] as? JSON { return .map(m.mapValues(parseValue)) }
    if let u = object["uuid"] { return .uuid(uuid(u)) }
    fatalError("not a value: \(object)")
}

// MARK: - Timestamps, contexts, states

func timestampJSON(_ t: HLCTimestamp) -> Any { ["physical": num(t.physicalMilliseconds), "logical": Int(t.logical)] }

func parseTimestamp(_ any: Any?) -> HLCTimestamp {
    guard let object = any as? JSON else { return .zero }
    return HLCTimestamp(physicalMilliseconds: u64(object["physical"]), logical: UInt16(u64(object["logical"])))
}

func dotJSON(_ dot: Dot) -> Any { ["replica": replicaHex(dot.replica), "counter": num(dot.counter)] }
func parseDot(_ any: Any?) -> Dot {
    let object = any as! JSON
    return Dot(replica: replica(object["replica"]), counter: u64(object["counter"]))
}

/// `{replica hex: {contiguous, cloud: [counters]}}`.
func contextJSON(_ context: CausalContext) -> Any {
    var out: JSON = [:]
    for replica in context.replicas {
        out[replicaHex(replica)] = ["contiguous": num(context.versionVector[replica] ?? 0),
                                    "cloud": (context.dotCloud[replica] ?? []).sorted().map(num)]
    }
    return out
}

func parseContext(_ any: Any?) -> CausalContext {
    var context = CausalContext(versionVector: [:])
    for (key, entry) in any as! JSON {
        let entry = entry as! JSON
        let id = replica(key)
        var dots = CausalContext(versionVector: [id: u64(entry["contiguous"])])
        for counter in entry["cloud"] as! [Any] { dots.insert(Dot(replica: id, counter: u64(counter))) }
        context.merge(dots)
    }
    return context
}

/// `{context, collections: {name: {record uuid: {fields: {name: register}, presence: {replica: entry}}}}}`.
func stateJSON(_ map: RecordMap) -> Any {
    var collections: JSON = [:]
    for (collection, records) in map.collections {
        var out: JSON = [:]
        for (id, state) in records {
            var fields: JSON = [:]
            for (name, r) in state.fields {
                fields[name] = ["value": valueJSON(r.value), "timestamp": timestampJSON(r.timestamp), "dot": dotJSON(r.dot),
                                "supersedes": r.supersedes == .zero ? NSNull() as Any : timestampJSON(r.supersedes)]
            }
            var presence: JSON = [:]
            for (writer, entry) in state.presence {
                presence[replicaHex(writer)] = ["counter": num(entry.counter),
                                                "removedBy": entry.removedBy.map(dotJSON) ?? NSNull() as Any]
            }
            out[uuidText(id)] = ["fields": fields, "presence": presence]
        }
        collections[collection] = out
    }
    return ["context": contextJSON(map.context), "collections": collections]
}

func parseState(_ any: Any?) -> RecordMap {
    let object = any as! JSON
    var records: [(RecordKey, RecordState)] = []
    for (collection, recordsJSON) in object["collections"] as! JSON {
        for (id, recordJSON) in recordsJSON as! JSON {
            let record = recordJSON as! JSON
            var fields: SortedMap<String, FieldRegister> = [:]
            var presence: SortedMap<ReplicaID, PresenceEntry> = [:]
            for (name, registerJSON) in record["fields"] as! JSON {
                let r = registerJSON as! JSON
                fields[name] = FieldRegister(value: parseValue(r["value"]), timestamp: parseTimestamp(r["timestamp"]),
                                                   dot: parseDot(r["dot"]), supersedes: parseTimestamp(r["supersedes"]))
            }
            for (writer, entryJSON) in record["presence"] as! JSON {
                let entry = entryJSON as! JSON
                presence[replica(writer)] = PresenceEntry(
                    counter: u64(entry["counter"]), removedBy: (entry["removedBy"] is NSNull) ? nil : parseDot(entry["removedBy"]))
            }
            records.append((RecordKey(collection: collection, id: uuid(id)), RecordState(fields: fields, presence: presence)))
        }
    }
    return RecordMap(records: records, context: parseContext(object["context"]))
}

// MARK: - Files

enum VectorFiles {
    /// docs/vectors, found from this source file's path.
    static var directory: URL {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("docs/vectors")
    }

    /// Deterministic JSON on every platform: keys sorted, two-space indentation, strings with
    /// only `"`, `\\` and control characters escaped.
    static func serialize(_ object: JSON) -> String {
        var out = ""
        write(object, indent: 0, into: &out)
        return out + "\n"
    }

    private static func write(_ value: Any, indent: Int, into out: inout String) {
        let pad = String(repeating: "  ", count: indent + 1)
        let end = String(repeating: "  ", count: indent)
        switch value {
        case let text as String: out += quote(text)
        case let flag as Bool: out += flag ? "true" : "false"
        case let number as Int: out += String(number)
        case is NSNull: out += "null"
        case let object as [String: Any]:
            if object.isEmpty { out += "{}"; return }
            out += "{\n"
            for (index, key) in object.keys.sorted().enumerated() {
                out += pad + quote(key) + ": "
                write(object[key]!, indent: indent + 1, into: &out)
                out += index < object.count - 1 ? ",\n" : "\n"
            }
            out += end + "}"
        case let array as [Any]:
            if array.isEmpty { out += "[]"; return }
            out += "[\n"
            for (index, item) in array.enumerated() {
                out += pad
                write(item, indent: indent + 1, into: &out)
                out += index < array.count - 1 ? ",\n" : "\n"
            }
            out += end + "]"
        default: fatalError("not JSON: \(value)")
        }
    }

    private static func quote(_ text: String) -> String {
        var out = "\""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            default:
                if scalar.value < 0x20 { out += String(format: "\\u%04x", scalar.value) } else { out.unicodeScalars.append(scalar) }
            }
        }
        return out + "\""
    }

    static func load(_ name: String) throws -> JSON {
        let data = try Data(contentsOf: directory.appendingPathComponent(name))
        return try JSONSerialization.jsonObject(with: data) as! JSON
    }

    static func loadIfPresent(_ name: String) -> JSON? { try? load(name) }

    static func list() throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: directory.path).filter { $0.hasSuffix(".json") }.sorted()
    }
}
