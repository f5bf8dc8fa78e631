import Foundation

/// One line of a node's log that says the convergence watchdog repaired a session.
struct RepairLine: Sendable, Equatable {
    var device: Int
    /// The peer's replica ID as the line gives it (8 hex digits).
    var peer: String
    var at: Date
}

/// The end-of-month judgement (issue 29), apart from the processes: what every device must hold,
/// that they agree, the roster, and the watchdog's repairs.
enum MonthOracle {
    /// What one device showed at the end.
    struct Observation: Sendable {
        var device: Int
        var state: ObservedState
        var digest: String?
        var role: String?
        var roster: [MonthDevice]
    }

    /// Every failed check, by name, each with its lines (device, record, expected vs actual).
    static func judge(_ script: MonthScript, _ observations: [Observation]) -> [String: [String]] {
        var failures: [String: [String]] = [:]
        let active = observations.filter { $0.device != script.removed }
        let removed = observations.first { $0.device == script.removed }

        // (1) One digest.
        if Set(active.map { $0.digest ?? "?" }).count != 1 {
            failures["digests differ", default: []] = active.map { "d\($0.device): \($0.digest?.prefix(8) ?? "no status")" }
        }
        // (2)–(5) Every active device equal to the model of everything the active devices hold:
        // every record added and not deleted, each field one of its last writes; deleted ones
        // absent (never resurrected by a restored device); offline writes after a restore present;
        // the removed device's writes after its removal absent.
        let known = script.finalKnowledge
        let differences = active.flatMap { script.model.differences(device: $0.device, observed: $0.state, known: known) }
        if !differences.isEmpty { failures["records (active devices)"] = summary(differences) + differences.map(\.description) }
        // The removed device holds what it had when removed plus its own later writes: nothing new.
        if let removed {
            let differences = script.model.differences(device: removed.device, observed: removed.state, known: script.removedKnowledge)
            if !differences.isEmpty { failures["records (the removed device)"] = summary(differences) + differences.map(\.description) }
            if removed.role != "removed" { failures["removed device's status", default: []].append("d\(removed.device) says \(removed.role ?? "nothing")") }
        }
        // Races: whichever value won, the same on every device.
        if let first = active.first {
            for (record, fields) in first.state.records.sorted(by: { $0.key < $1.key }) {
                for (field, value) in fields.sorted(by: { $0.key < $1.key }) {
                    let others = active.dropFirst().filter { ($0.state.records[record]?[field]).map { $0 != value } ?? false }
                    if !others.isEmpty {
                        failures["devices disagree", default: []].append(
                            "record \(record).\(field.rawValue): d\(first.device) \(value), "
                                + others.map { "d\($0.device) \($0.state.records[record]![field]!)" }.joined(separator: ", "))
                    }
                }
            }
        }
        // The roster: the same on every active device, the removal kept, the late joiner admitted.
        let rosters = Set(active.map { Set($0.roster.map { "\($0.name):\($0.role):\($0.removed ? "removed" : "active")" }) })
        if rosters.count != 1 {
            failures["rosters differ", default: []] = active.map { o in
                "d\(o.device): " + o.roster.sorted { $0.name < $1.name }.map { "\($0.name) \($0.role)\($0.removed ? " removed" : "")" }.joined(separator: ", ")
            }
        }
        for observation in active {
            let roster = Dictionary(observation.roster.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a })
            if roster["d\(script.removed)"]?.removed != true {
                failures["rosters differ", default: []].append("d\(observation.device) does not list d\(script.removed) as removed")
            }
            for device in script.active where roster["d\(device)"].map({ $0.removed }) ?? true {
                failures["rosters differ", default: []].append("d\(observation.device) does not list d\(device) as an active device")
            }
        }
        return failures
    }

    /// One line: per device, how many records are missing, present but deleted, or hold a wrong value.
    static func summary(_ differences: [Difference]) -> [String] {
        let perDevice = Dictionary(grouping: differences, by: \.device).sorted { $0.key < $1.key }.map { device, list in
            let count = { (test: (Difference.Problem) -> Bool) in list.filter { test($0.problem) }.count }
            let missing = count { if case .missing = $0 { true } else { false } }
            let unexpected = count { if case .unexpected = $0 { true } else { false } }
            let values = count { if case .value = $0 { true } else { false } }
            let unknown = count { if case .unknownRecord = $0 { true } else { false } }
            return "d\(device): \(missing) missing, \(unexpected) that should be absent, \(values) wrong values"
                + (unknown > 0 ? ", \(unknown) never written" : "")
        }
        return ["summary — " + perDevice.joined(separator: "; ")]
    }

    /// The repairs, as one per pair of devices within 5 s (both sides of one exchange log it):
    /// those of a session with a device restored before it, counted against that restore (at
    /// most one each), and the others (none allowed).
    static func repairs(_ lines: [RepairLine], owners: [String: Int], restores: [(device: Int, number: Int, at: Date)],
                        days: [Date] = []) -> (perRestore: [Int: Int], outside: [String]) {
        var perRestore: [Int: Int] = [:]
        var outside: [String] = []
        var seen: [(pair: Set<Int>, at: Date)] = []
        for line in lines.sorted(by: { $0.at < $1.at }) {
            let peer = owners.first { $0.key.hasPrefix(line.peer) }?.value
            let pair: Set<Int> = [line.device, peer ?? -1]
            if seen.contains(where: { $0.pair == pair && abs($0.at.timeIntervalSince(line.at)) <= 5 }) { continue }
            seen.append((pair, line.at))
            if let restore = restores.last(where: { pair.contains($0.device) && $0.at.timeIntervalSince(line.at) <= 1 }) {
                perRestore[restore.number, default: 0] += 1
            } else {
                let time = ISO8601DateFormatter().string(from: line.at)
                let day = (days.lastIndex { $0.timeIntervalSince(line.at) <= 1 }).map { "day \($0)" } ?? "?"
                outside.append("\(day): d\(line.device) with \(peer.map { "d\($0)" } ?? "replica \(line.peer)") at \(time)")
            }
        }
        return (perRestore, outside)
    }

    /// A repair line of `device`'s log, if `line` is one:
    /// `2026-11-28T11:24:06+0000 warning peersync : peer.id=1a2b3c4d repairs=1 [PeerSyncSession] digests differ …`
    static func repairLine(_ line: Substring, device: Int) -> RepairLine? {
        guard line.contains("repairing by a full-state exchange"), let range = line.range(of: "peer.id=") else { return nil }
        let peer = line[range.upperBound...].prefix { $0.isHexDigit }
        let formatter = DateFormatter()
        formatter.locale = Locale(identifier: "en_US_POSIX")
        formatter.dateFormat = "yyyy-MM-dd'T'HH:mm:ssZ"
        let at = line.split(separator: " ").first.flatMap { formatter.date(from: String($0)) } ?? .distantPast
        return RepairLine(device: device, peer: String(peer), at: at)
    }

    /// The log's warnings and errors (and refusals), metadata removed, with how often each device logged them.
    static func notableLines(_ logs: [(device: Int, text: String)]) -> [String] {
        var counts: [String: [Int: Int]] = [:]
        for (device, text) in logs {
            for line in text.split(separator: "\n") {
                let words = line.split(separator: " ", maxSplits: 2)
                guard words.count == 3 else { continue }
                let level = words[1]
                guard level == "warning" || level == "error" || line.contains("refus") || line.contains("unknown device")
                        || line.contains("restored") else { continue }
                let message = line.range(of: "] ").map { String(line[$0.upperBound...]) } ?? String(words[2])
                counts["\(level): \(message)", default: [:]][device, default: 0] += 1
            }
        }
        return counts.sorted { $0.value.values.reduce(0, +) > $1.value.values.reduce(0, +) }.map { message, perDevice in
            "\(perDevice.sorted { $0.key < $1.key }.map { "d\($0.key)×\($0.value)" }.joined(separator: " ")) \(message)"
        }
    }
}
