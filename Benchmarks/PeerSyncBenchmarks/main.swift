import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel

// PeerSync benchmarks. Build in release for numbers:
//   swift run -c release PeerSyncBenchmarks [--quick] [--json FILE] [--svg FILE] [name ...]
// `--quick` shrinks every workload so CI can smoke-test the code paths in seconds; its
// numbers mean nothing. Names: see `--help`.

struct Options {
    var quick = false
    var jsonPath: String?
    var svgPath: String?
    var beforePath: String?
    /// Results of an earlier run to report (and chart) instead of running benchmarks.
    var resultsPath: String?
    var names: [String] = []

    init(_ arguments: [String]) throws {
        var rest = arguments[...]
        while let argument = rest.popFirst() {
            switch argument {
            case "--quick": quick = true
            case "--json":
                guard let path = rest.popFirst() else { throw UsageError("--json needs a file path") }
                jsonPath = path
            case "--svg":
                guard let path = rest.popFirst() else { throw UsageError("--svg needs a file path") }
                svgPath = path
            case "--before":
                guard let path = rest.popFirst() else { throw UsageError("--before needs the JSON file of an older build's run") }
                beforePath = path
            case "--results":
                guard let path = rest.popFirst() else { throw UsageError("--results needs the JSON file of a run") }
                resultsPath = path
            case "-h", "--help": throw UsageError(nil)
            default:
                guard Benchmark.all.contains(where: { $0.name == argument }) else {
                    throw UsageError("unknown benchmark \"\(argument)\"; known: \(Benchmark.all.map(\.name).joined(separator: ", "))")
                }
                names.append(argument)
            }
        }
    }
}

struct UsageError: Error {
    let message: String?
    init(_ message: String?) { self.message = message }
}

do {
    let options = try Options(Array(CommandLine.arguments.dropFirst()))
    let selected = options.names.isEmpty ? Benchmark.all : Benchmark.all.filter { options.names.contains($0.name) }
    var results: [Result] = []
    if let path = options.resultsPath {
        // `--results FILE --svg OUT [--before OLD]`: chart (and tabulate) a saved run.
        results = try JSONDecoder().decode([Result].self, from: Data(contentsOf: URL(fileURLWithPath: path)))
    }
    print(options.quick ? "PeerSync benchmarks (quick mode: smoke test, numbers not meaningful)" : "PeerSync benchmarks")
    for benchmark in selected where options.resultsPath == nil {
        let result = try await benchmark.run(options.quick)
        results.append(result)
        let metrics = result.metrics.sorted { $0.key < $1.key }
            .map { "\($0.key)=\(String(format: "%.3f", $0.value))" }.joined(separator: "  ")
        print("\(result.name.padding(toLength: 14, withPad: " ", startingAt: 0)) \(metrics)   — \(result.detail)")
    }
    if let table = Report.table(results) {
        print("\nConvergence (ms; bytes on the wire incl. TLS; messages = frames sent):\n" + table)
    }
    if let path = options.jsonPath {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        try encoder.encode(results).write(to: URL(fileURLWithPath: path))
    }
    if let path = options.svgPath {
        let before = try options.beforePath.map { try JSONDecoder().decode([Result].self, from: Data(contentsOf: URL(fileURLWithPath: $0))) } ?? []
        try Data(Chart.svg(results, before: before).utf8).write(to: URL(fileURLWithPath: path))
    }
} catch let error as UsageError {
    if let message = error.message {
        FileHandle.standardError.write(Data("PeerSyncBenchmarks: \(message)\n".utf8))
        exit(2)
    }
    print("usage: PeerSyncBenchmarks [--quick] [--json FILE] [--svg FILE [--before OLD.json]] [--results RUN.json] [\(Benchmark.all.map(\.name).joined(separator: "|"))]...")
} catch {
    FileHandle.standardError.write(Data("PeerSyncBenchmarks: \(error)\n".utf8))
    exit(1)
}
