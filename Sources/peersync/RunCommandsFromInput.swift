import Foundation
import PeerSync
import ShiftSchedulerModel

/// `peersync run --commands`: a long-lived writer for scripts and benchmarks. Reads one command
/// per line from standard input and answers on standard output, one line each:
///
/// ```
/// put ID FIELD=VALUE…   write fields of shift type ID (a UUID) as one commit  → "ok ID"
/// digest                the state digest                                     → "digest HEX"
/// (from peers)          records a peer's change touched                     → "changed ID…"
/// ```
/// VALUE is an integer, or text (the rest up to the next space; `_` stands for a space).
/// A bad line is answered "error TEXT" and changes nothing. End of input leaves the node running.
enum CommandInput {
    static func run(_ replica: Replica) async {
        let output = LineOutput()
        let watcher = Task {
            for await change in replica.changes() {
                guard case .peer = change.origin, !change.records.isEmpty else { continue }
                output.write("changed " + change.records.map { $0.id.uuidString }.sorted().joined(separator: " "))
            }
        }
        defer { watcher.cancel() }
        // Reading stdin blocks: on its own thread, handing lines over one at a time.
        let lines = AsyncStream<String> { continuation in
            Thread.detachNewThread {
                while let line = readLine() { continuation.yield(line) }
                continuation.finish()
            }
        }
        for await line in lines {
            output.write(await answer(line, replica))
        }
        // Input closed: keep syncing until the service stops.
        while !Task.isCancelled { try? await Task.sleep(for: .seconds(3600)) }
    }

    static func answer(_ line: String, _ replica: Replica) async -> String {
        let words = line.split(separator: " ").map(String.init)
        switch words.first {
        case "put":
            guard words.count >= 3, let id = UUID(uuidString: words[1]) else { return "error usage: put ID FIELD=VALUE…" }
            var fields: [String: FieldValue] = [:]
            for pair in words.dropFirst(2) {
                guard let equals = pair.firstIndex(of: "="), equals != pair.startIndex else { return "error not FIELD=VALUE: \(pair)" }
                let text = String(pair[pair.index(after: equals)...])
                fields[String(pair[..<equals])] = Int64(text).map(FieldValue.int) ?? .string(text.replacingOccurrences(of: "_", with: " "))
            }
            let key = RecordKey(collection: ShiftType.collection, id: id)
            do {
                try await replica.commit { $0.upsert(fields, to: key) }
                return "ok \(id.uuidString)"
            } catch {
                return "error \(error)"
            }
        case "digest":
            return "digest \(replica.state.digest)"
        default:
            return "error unknown command: \(line.prefix(40))"
        }
    }
}

/// Whole lines to standard output, flushed at once, from any task.
final class LineOutput: Sendable {
    private let lock = NSLock()

    func write(_ line: String) {
        lock.lock()
        defer { lock.unlock() }
        FileHandle.standardOutput.write(Data((line + "\n").utf8))
    }
}
