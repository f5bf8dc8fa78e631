import Foundation
import PeerSyncTestSupport
import Testing

/// `peersync` processes on 127.0.0.1 (never discovery: these run in the machine's own namespace).
enum Nodes {
    static let binary = buildProductsDirectory().appendingPathComponent("peersync").path

    /// Trials per scenario: 10 in CI, `PEERSYNC_TRIALS` (e.g. 50) in the long mode.
    static let trials = Int(ProcessInfo.processInfo.environment["PEERSYNC_TRIALS"] ?? "") ?? 10

    @discardableResult
    static func cli(_ store: String, _ arguments: [String]) throws -> CommandResult {
        try runCommand(binary, arguments + ["--store", store])
    }

    struct Status: Decodable {
        struct Node: Decodable {
            struct Peer: Decodable { var replicaID: String }
            var pid: Int32
            var listen: String
            var peers: [Peer]
        }
        var digest: String
        var records: [String: Int]
        var node: Node?
    }

    static func status(_ store: String) -> Status? {
        guard let result = try? cli(store, ["status", "--json"]), result.status == 0 else { return nil }
        return try? JSONDecoder().decode(Status.self, from: Data(result.stdout.utf8))
    }

    /// Creates `count` stores in one group; returns their directories.
    static func group(_ count: Int, label: String) throws -> [String] {
        let stores = try (0..<count).map { _ in try makeTemporaryDirectory(label) }
        try #require(try cli(stores[0], ["init", "--name", "n0"]).status == 0)
        for (i, store) in stores.enumerated().dropFirst() {
            let code = try cli(stores[0], ["invite"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
            try #require(try cli(store, ["init", "--name", "n\(i)", "--join", code]).status == 0)
        }
        return stores
    }

    static func start(_ store: String, peers: [String] = []) throws -> ChildProcess {
        try ChildProcess(binary, ["run", "--store", store, "--listen", "127.0.0.1:0", "--log-level", "error", "--no-discovery"]
                            + peers.flatMap { ["--peer", $0] })
    }

    /// The address a started node listens on (from its status file), waiting up to 20 s.
    static func address(_ store: String, pid: Int32) async throws -> String {
        var address: String?
        _ = await eventually { 
            if let node = status(store)?.node, node.pid == pid { address = node.listen }
            return address != nil
        }
        return try #require(address, "node of \(store) did not come up")
    }

    static func converged(_ stores: [String]) -> Bool {
        let digests = stores.compactMap { status($0)?.digest }
        return digests.count == stores.count && Set(digests).count == 1
    }

    /// A `peersync export`-format file with `count` shift types (for big catch-ups).
    static func bulkFile(count: Int) throws -> String {
        let shifts = (0..<count).map { i in
            #"{"id":"\#(UUID().uuidString)","symbol":"S\#(i % 100)","title":"Bulk shift \#(i)","description":"Imported for the crash trials, number \#(i)","duration":28800}"#
        }
        let json = #"{"format":"peersync-export","version":1,"collections":{"shiftTypes":[\#(shifts.joined(separator: ","))]},"settings":{}}"#
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("bulk-\(UUID().uuidString).json").path
        try json.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }
}
