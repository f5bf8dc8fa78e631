import Foundation

/// The convergence results as one table on stdout: a row per workload and transfer (or peer count).
enum Report {
    static let columns = ["converge_ms", "p50_ms", "p99_ms", "bytes_per_record", "bytes_per_op", "messages"]

    static func table(_ results: [Result]) -> String? {
        var rows: [[String]] = []
        for result in results {
            // Row prefixes: `deltas`, `fullstate`, `deltas_8p`, `4p`…, from keys ending in a column name.
            var prefixes: Set<String> = []
            for key in result.metrics.keys {
                for column in columns where key.hasSuffix("_" + column) { prefixes.insert(String(key.dropLast(column.count + 1))) }
            }
            for prefix in prefixes.sorted(by: { order($0) < order($1) }) {
                let cells = columns.map { column in
                    result.metrics["\(prefix)_\(column)"].map { String(format: $0 >= 100 ? "%.0f" : "%.2f", $0) } ?? "–"
                }
                rows.append([result.name, prefix] + cells)
            }
        }
        guard !rows.isEmpty else { return nil }
        let header = ["benchmark", "run"] + columns
        let widths = header.indices.map { i in ([header] + rows).map { $0[i].count }.max()! }
        func line(_ cells: [String]) -> String {
            cells.enumerated().map { i, cell in
                i < 2 ? cell.padding(toLength: widths[i], withPad: " ", startingAt: 0)
                    : String(repeating: " ", count: widths[i] - cell.count) + cell
            }.joined(separator: "  ")
        }
        return ([line(header), line(widths.map { String(repeating: "-", count: $0) })] + rows.map(line)).joined(separator: "\n")
    }

    /// Sort `deltas_2p` before `deltas_16p`: by transfer, then peer count.
    static func order(_ prefix: String) -> String {
        let parts = prefix.split(separator: "_")
        let peers = parts.last.flatMap { $0.hasSuffix("p") ? Int($0.dropLast()) : nil } ?? 0
        return (parts.first.map(String.init) ?? "") + String(format: "%04d", peers)
    }
}
