import Foundation
import PeerSyncTestSupport
import Testing

/// A group's month through the `peersync` command (issue 29): five devices on 127.0.0.1 with
/// static `--peer`s, offline days, races, SIGKILLs, compaction, a late join, a removal, and two
/// restores (a member and the first admin, one as a copy and one in place, from backups older
/// than deletes, purges, an admission and maybe the removal), judged against a model of what
/// every device must hold. CI: one month from the fixed seed. `PEERSYNC_LONG=1`
/// (`Scripts/reliability.sh`): `PEERSYNC_MONTHS` (20) months of `PEERSYNC_MONTH_DAYS` (14) days
/// from seeds `PEERSYNC_SEED`, +1, +2, …
@Suite("A group's month", .serialized)
struct MonthTests {
    static let environment = ProcessInfo.processInfo.environment
    static let long = environment["PEERSYNC_LONG"] == "1"
    static let months = long ? Int(environment["PEERSYNC_MONTHS"] ?? "") ?? 20 : 1
    static let days = Int(environment["PEERSYNC_MONTH_DAYS"] ?? "") ?? (long ? 14 : 10)

    @Test("a month of five devices through the CLI: every device equal to the model, no repair outside a restore")
    func month() async throws {
        let started = ContinuousClock.now
        var passed = 0
        for n in 0..<Self.months {
            let seed = baseSeed &+ UInt64(n)
            let began = ContinuousClock.now
            // Its own thread: the month waits for processes by blocking (ThreadExecutor).
            let (failures, summary) = try await onOwnThread("month") { try await Self.live(seed: seed, days: Self.days) }
            let seconds = Int((ContinuousClock.now - began).components.seconds)
            print("month: seed \(seed): \(failures.isEmpty ? "passed" : "FAILED") in \(seconds) s — \(summary)")
            if failures.isEmpty { passed += 1 }
            for (check, lines) in failures.sorted(by: { $0.key < $1.key }) {
                let shown = lines.prefix(20).map { "  " + $0 }.joined(separator: "\n")
                let more = lines.count > 20 ? "\n  … \(lines.count - 20) more" : ""
                Issue.record("month seed \(seed) (PEERSYNC_SEED=\(seed)): \(check) (\(lines.count)):\n\(shown)\(more)")
            }
        }
        print("month: \(passed)/\(Self.months) months passed in \(Int((ContinuousClock.now - started).components.seconds)) s")
    }

    /// Lives one month; returns the failed checks and a one-line summary.
    static func live(seed: UInt64, days: Int) async throws -> (failures: [String: [String]], summary: String) {
        let script = MonthScript.generate(seed: seed, days: days)
        let runner = try MonthRunner(script)
        var judged = false
        defer {
            runner.stopAll()
            if judged || environment["PEERSYNC_KEEP"] == nil { runner.removeFiles() } else { print("month: kept \(runner.root)") }
        }
        try await runner.run()
        let observations = try (0..<MonthScript.devices).map { try runner.observe($0) }
        runner.stopAll()
        var failures = runner.problems
        for (check, lines) in MonthOracle.judge(script, observations) { failures[check, default: []] += lines }

        // (6) Repairs: none outside a restore, at most one per restore.
        let logs = runner.logTexts()
        let lines = logs.flatMap { log in log.text.split(separator: "\n").compactMap { MonthOracle.repairLine($0, device: log.device) } }
        let (perRestore, outside) = MonthOracle.repairs(lines, owners: runner.owners, restores: runner.restoredAt, days: runner.dayStarted)
        if !outside.isEmpty { failures["repairs outside a restore"] = outside }
        for (restore, count) in perRestore.sorted(by: { $0.key < $1.key }) where count > 1 {
            failures["repairs per restore", default: []].append("restore #\(restore): \(count) repairs")
        }
        if !failures.isEmpty {
            failures["(context) log lines"] = Array(MonthOracle.notableLines(logs).prefix(20))
            let text = failures.sorted { $0.key < $1.key }.map { "\($0.key):\n" + $0.value.map { "  \($0)\n" }.joined() }.joined()
            try? text.write(toFile: "\(runner.root)/failures.txt", atomically: true, encoding: .utf8)
            judged = environment["PEERSYNC_KEEP"] == nil
        } else {
            judged = true
        }

        let ops = script.model.ops
        let restores = script.restores.map { "d\($0.device) \($0.inPlace ? "in place" : "as a copy") on day \($0.day) from day \($0.backupDay)" }
        let kills = script.days.flatMap(\.actions).filter { if case .kill = $0 { return true } else { return false } }.count
        let summary = "\(script.days.count - 1) days, \(ops.count) edits (\(ops.filter { $0.kind == .delete }.count) deletes, "
            + "\(ops.filter { $0.note == .race }.count / 2) races), \(kills) kills, restores: \(restores.joined(separator: "; ")); "
            + "d\(script.removed) removed on day \(script.removalDay); repairs: \(lines.count) logged "
            + "(status: \(runner.repairsFromStatus.values.reduce(0, +))), per restore \(perRestore.sorted { $0.key < $1.key }.map { "#\($0.key): \($0.value)" })"
        return (failures, summary)
    }

    // MARK: The model and the generator, alone

    @Test("model: last write per field, races allow either value, deletes hide, a concurrent edit revives, restores forget")
    func model() {
        var m = MonthModel(devices: 3)
        let r = m.add(.location, by: 0, day: 0, fields: [.name: .text("a"), .address: .text("x")])
        m.sync([0, 1, 2])
        m.set(r, by: 1, day: 1, fields: [.name: .text("b")])
        #expect(m.candidates(r, .name, in: m.knowledge[1]) == [.text("b")])
        #expect(m.candidates(r, .name, in: m.knowledge[2]) == [.text("a")])
        // Apart: 1 and 2 both write the name; either may win.
        m.set(r, by: 2, day: 1, fields: [.name: .text("c")])
        m.sync([0, 1, 2])
        #expect(m.candidates(r, .name, in: m.knowledge[0]) == [.text("b"), .text("c")])
        #expect(m.candidates(r, .address, in: m.knowledge[0]) == [.text("x")])
        let before = m.knowledge[2]
        // A delete seen by everyone hides the record; a restore to before it shows it again.
        m.delete(r, by: 0, day: 2)
        m.sync([0, 1, 2])
        #expect(!m.isVisible(r, to: 1) && m.isDoomed(r))
        m.restore(2, to: before)
        #expect(m.isVisible(r, to: 2))
        // An edit the delete had not seen revives the record whole.
        var n = MonthModel(devices: 2)
        let s = n.add(.location, by: 0, day: 0, fields: [.name: .text("a"), .address: .text("x")])
        n.sync([0, 1])
        n.delete(s, by: 0, day: 1)
        n.set(s, by: 1, day: 1, fields: [.name: .text("b")])
        n.sync([0, 1])
        #expect(n.expected(n.knowledge[0])[s] == [.name: [.text("b")], .address: [.text("x")]])
        // The diff names what differs.
        let observed = ObservedState(records: [s: [.name: .text("a"), .address: .text("x")]], unknown: ["locations/X"])
        let differences = n.differences(device: 0, observed: observed, known: n.knowledge[0]).map(\.description)
        #expect(differences.count == 2 && differences[0].contains("name = \"a\", expected \"b\""), "\(differences)")
    }

    @Test("generator: the same seed gives the same month; deletes never race an edit but once, on purpose; the removed device learns nothing")
    func generator() {
        let a = MonthScript.generate(seed: 7), b = MonthScript.generate(seed: 7), c = MonthScript.generate(seed: 8)
        #expect(a.days.map(\.actions) == b.days.map(\.actions))
        #expect(a.days.map(\.actions) != c.days.map(\.actions))
        for seed in UInt64(1)...30 {
            let script = MonthScript.generate(seed: seed)
            let model = script.model
            let actions = script.days.flatMap(\.actions)
            #expect(script.restores.count == 2 && Set(script.restores.map(\.inPlace)) == [true, false])
            #expect(Set(script.restores.map(\.device)).contains(0))
            #expect(script.restores.allSatisfy { $0.backupDay < 5 && $0.day > 5 })
            #expect(script.restores.contains { $0.day > script.removalDay })
            #expect(actions.contains { if case .kill = $0 { true } else { false } })
            #expect(model.ops.filter { $0.note == .revive }.count == 3, "seed \(seed)")
            for delete in model.ops where delete.kind == .delete {
                for write in model.records[delete.record].ops.map({ model.ops[$0] }) where write.kind != .delete && write.note != .afterRemoval
                    && write.note != .revive {
                    #expect(delete.knew.contains(write.index), "seed \(seed): op \(write.index) concurrent with delete \(delete.index)")
                }
            }
            #expect(!script.finalKnowledge.contains { model.ops[$0].note == .afterRemoval })
            #expect(!script.removedKnowledge.contains { model.ops[$0].device != script.removed && model.ops[$0].day > script.removalDay })
            // Every action on a node comes while it runs (kills) or is stopped (backups, restores).
            var running: Set<Int> = []
            for action in actions {
                switch action {
                case .start(let d): #expect(running.insert(d).inserted)
                case .stop(let d): #expect(running.remove(d) != nil)
                case .kill(let d, _): #expect(running.contains(d), "seed \(seed)")
                case .backup(let d), .restore(let d, _, _): #expect(!running.contains(d), "seed \(seed)")
                default: break
                }
            }
        }
    }
}
