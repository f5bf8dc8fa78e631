import ArgumentParser
import Foundation
import Logging
import PeerSync
import ShiftSchedulerModel

struct Demo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run several local replicas on 127.0.0.1, edit them concurrently, and watch them converge.",
        discussion: "Uses temporary stores and real TLS sessions; touches nothing of yours.")

    @Option(help: "How many replicas (2–8).") var replicas = 3
    @Option(help: "Edits each replica makes.") var edits = 25

    func run() async throws {
        guard (2...8).contains(replicas) else { throw CLIError("--replicas must be 2 to 8") }
        guard (1...10_000).contains(edits) else { throw CLIError("--edits must be 1 to 10000") }
        var logger = Logger(label: "demo")
        logger.logLevel = .critical
        let names = ["alba", "berg", "cova", "dune", "elm", "fjord", "glen", "heath"]
        let group = try LocalGroup.make(names: Array(names.prefix(replicas)), groupName: "demo")
        var nodes: [Replica] = []
        var directories: [String] = []
        defer { for d in directories { try? FileManager.default.removeItem(atPath: d) } }
        print("PeerSync demo: \(replicas) replicas, one sync group (\(group.groupID.description.prefix(8))…), mutual TLS 1.3 on 127.0.0.1\n")
        var ports: [UInt16] = []
        for i in 0..<replicas {
            let dir = FileManager.default.temporaryDirectory.appendingPathComponent("peersync-demo-\(UUID().uuidString)").path
            directories.append(dir)
            let replica = try Replica.create(at: dir, member: i, of: group, logger: logger)
            nodes.append(replica)
            ports.append(try await replica.startSync(SyncConfiguration(security: .tls, listen: PeerAddress(host: "127.0.0.1", port: 0))))
        }
        // Before they meet, each sets the week's first day: a true conflict, logged where it lost.
        for (i, replica) in nodes.enumerated() {
            try await replica.setSetting(SettingKey.weekStart, to: .int(Int64(i + 1)), scope: .synced)
        }
        for (i, replica) in nodes.enumerated() where i > 0 {
            await replica.addPeer(PeerAddress(host: "127.0.0.1", port: ports[i - 1]))
        }
        print("each set weekStart while apart; connected in a chain: " + names.prefix(replicas).joined(separator: " — ") + " (no direct link between the ends)\n")
        // A shared location, then concurrent edits everywhere.
        let ward = Location(name: "Ward 3", address: "Main St 1")
        try await nodes[0].save(ward)
        let start = ContinuousClock.now
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (i, replica) in nodes.enumerated() {
                group.addTask {
                    var mine: [ShiftType] = []
                    for n in 0..<edits {
                        if n % 5 == 4, var shift = mine.randomElement() {
                            shift.title += "*"
                            try await replica.save(shift)
                        } else {
                            let shift = ShiftType(symbol: "\(names[i].first!.uppercased())\(n)", title: "\(names[i]) shift \(n)",
                                                  duration: Double([6, 8, 10, 12].randomElement()!) * 3_600, locationID: ward.id)
                            mine.append(shift)
                            try await replica.save(shift)
                        }
                    }
                }
            }
            try await group.waitForAll()
        }
        print("each replica made \(edits) edits concurrently; converging:\n")
        let deadline = ContinuousClock.now + .seconds(30)
        while true {
            let states = nodes.map(\.state)
            let line = states.map { s in
                "\(s.name): \((try? s.fetchAll(ShiftType.self).count) ?? 0) shift types, digest \(s.digest.description.prefix(8))"
            }.joined(separator: " | ")
            let elapsed = ContinuousClock.now - start
            print(String(format: "%6.0f ms  ", Double(elapsed.components.attoseconds) / 1e15 + Double(elapsed.components.seconds) * 1000) + line)
            if Set(states.map(\.digest)).count == 1 { break }
            guard ContinuousClock.now < deadline else { throw CLIError("replicas did not converge within 30 s") }
            try await Task.sleep(for: .milliseconds(50))
        }
        let final = nodes[replicas - 1].state
        print("\nconverged: every replica holds \(try final.fetchAll(ShiftType.self).count) shift types; weekStart = \(final.setting(SettingKey.weekStart, scope: .synced).map(SettingsCommand.render) ?? "?") everywhere (last writer wins)")
        // Each replica logs the overwrites it saw: the ones whose weekStart lost.
        var shown = false
        for replica in nodes {
            let conflicts = (try? replica.conflicts()) ?? []
            print("conflicts logged on \(replica.state.name): \(conflicts.count)", terminator: "")
            if let conflict = conflicts.last(where: { $0.field == SettingKey.weekStart }), !shown {
                shown = true
                print(" — \(conflict.field): \(conflict.loser.writerName ?? "another device")'s \(SettingsCommand.render(conflict.loser.value)) "
                    + "was replaced by \(conflict.winner.writerName ?? "another device")'s \(SettingsCommand.render(conflict.winner.value))", terminator: "")
            }
            print()
        }
        print("(`peersync conflicts` lists them on a real store)")
        for replica in nodes { await replica.stopSync() }
    }
}
