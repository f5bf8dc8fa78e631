import Foundation

/// A small hand-written SVG writer for the convergence results: convergence time vs peers
/// (`mesh`, `multiprocess`) and bytes on the wire vs operations (`w2-stream`). No dependencies.
enum Chart {
    struct Series {
        var name: String
        var color: String
        var points: [(x: Double, y: Double)]

        /// The same series as an older build's: greyer, named so.
        var asBefore: Series {
            Series(name: name + " (before)", color: Chart.before[color] ?? "#999999", points: points)
        }
    }

    /// Lighter shades for the "before" series.
    static let before = ["#1f77b4": "#9ecae1", "#d62728": "#fcae91", "#2ca02c": "#a1d99b"]

    /// The SVG document for `results` (panels without data are left out); `before`, results of
    /// an older build from the same run, is drawn in grey beside them.
    static func svg(_ results: [Result], before: [Result] = []) -> String {
        var panels: [String] = []
        let convergence = convergenceSeries(results) + convergenceSeries(before).map(\.asBefore)
        if !convergence.isEmpty {
            panels.append(panel(title: "Time to converge vs peers", xLabel: "peers", yLabel: "ms until all digests equal",
                                series: convergence, logX: true, logY: true))
        }
        let bytes = bytesSeries(results) + bytesSeries(before).map(\.asBefore)
        if !bytes.isEmpty {
            panels.append(panel(title: "Bytes on the wire vs operations (w2-stream)", xLabel: "single-field updates",
                                yLabel: "bytes (both directions, TLS incl.)", series: bytes, logX: true, logY: true))
        }
        if panels.isEmpty {
            panels.append(#"<text x="20" y="40" font-size="14">no mesh, multiprocess or w2-stream results to chart</text>"#)
        }
        let width = Double(panels.count) * panelWidth
        var out = #"<svg xmlns="http://www.w3.org/2000/svg" width="\#(fmt(width))" height="\#(fmt(panelHeight))" "#
        out += #"viewBox="0 0 \#(fmt(width)) \#(fmt(panelHeight))" font-family="sans-serif">"# + "\n"
        out += #"<rect width="100%" height="100%" fill="white"/>"# + "\n"
        for (i, body) in panels.enumerated() {
            out += #"<g transform="translate(\#(fmt(Double(i) * panelWidth)),0)">"# + "\n" + body + "</g>\n"
        }
        return out + "</svg>\n"
    }

    static func convergenceSeries(_ results: [Result]) -> [Series] {
        var series: [Series] = []
        if let mesh = results.first(where: { $0.name == "mesh" }) {
            for (label, color) in [("deltas", "#1f77b4"), ("fullstate", "#d62728")] {
                let points = points(mesh.metrics, prefix: "\(label)_", suffix: "p_converge_ms")
                if !points.isEmpty { series.append(Series(name: "in-process, \(label == "deltas" ? "deltas" : "full state")", color: color, points: points)) }
            }
        }
        if let multi = results.first(where: { $0.name == "multiprocess" }) {
            let points = points(multi.metrics, prefix: "", suffix: "p_converge_ms")
            if !points.isEmpty { series.append(Series(name: "peersync processes, deltas", color: "#2ca02c", points: points)) }
        }
        return series
    }

    static func bytesSeries(_ results: [Result]) -> [Series] {
        guard let w2 = results.first(where: { $0.name == "w2-stream" }) else { return [] }
        var series: [Series] = []
        for (label, color) in [("deltas", "#1f77b4"), ("fullstate", "#d62728")] {
            let points = points(w2.metrics, prefix: "\(label)_curve_bytes_at_", suffix: "")
            if !points.isEmpty { series.append(Series(name: label == "deltas" ? "deltas" : "full state", color: color, points: points)) }
        }
        return series
    }

    /// Metrics named `prefix<number>suffix` as (number, value), sorted.
    static func points(_ metrics: [String: Double], prefix: String, suffix: String) -> [(x: Double, y: Double)] {
        metrics.compactMap { key, value -> (x: Double, y: Double)? in
            guard key.hasPrefix(prefix), key.hasSuffix(suffix), key.count > prefix.count + suffix.count else { return nil }
            let middle = key.dropFirst(prefix.count).dropLast(suffix.count)
            guard let x = Double(middle), x > 0 else { return nil }
            return (x, value)
        }.sorted { $0.x < $1.x }
    }

    static let panelWidth = 560.0
    static let panelHeight = 400.0

    /// One line chart with axes, ticks, legend.
    static func panel(title: String, xLabel: String, yLabel: String, series: [Series], logX: Bool, logY: Bool) -> String {
        let (left, right, top, bottom) = (80.0, panelWidth - 20, 40.0, panelHeight - 60)
        let xs = series.flatMap { $0.points.map(\.x) }
        let ys = series.flatMap { $0.points.map(\.y) }.map { logY ? max($0, 1) : $0 }
        let (xMin, xMax) = range(xs, log: logX, zeroBased: false)
        let (yMin, yMax) = range(ys, log: logY, zeroBased: !logY)
        func scale(_ v: Double, _ lo: Double, _ hi: Double, _ log: Bool) -> Double {
            let (a, b, t) = log ? (log10(lo), log10(hi), log10(max(v, lo))) : (lo, hi, v)
            return b == a ? 0.5 : (t - a) / (b - a)
        }
        func px(_ x: Double) -> Double { left + scale(x, xMin, xMax, logX) * (right - left) }
        func py(_ y: Double) -> Double { bottom - scale(logY ? max(y, 1) : y, yMin, yMax, logY) * (bottom - top) }

        var out = #"<text x="\#(fmt(panelWidth / 2))" y="22" text-anchor="middle" font-size="15" font-weight="bold">\#(escape(title))</text>"# + "\n"
        out += #"<line x1="\#(fmt(left))" y1="\#(fmt(bottom))" x2="\#(fmt(right))" y2="\#(fmt(bottom))" stroke="black"/>"# + "\n"
        out += #"<line x1="\#(fmt(left))" y1="\#(fmt(top))" x2="\#(fmt(left))" y2="\#(fmt(bottom))" stroke="black"/>"# + "\n"
        for x in ticks(xMin, xMax, log: logX, preferred: logX ? Set(xs) : []) {
            out += #"<line x1="\#(fmt(px(x)))" y1="\#(fmt(bottom))" x2="\#(fmt(px(x)))" y2="\#(fmt(bottom + 5))" stroke="black"/>"#
            out += #"<text x="\#(fmt(px(x)))" y="\#(fmt(bottom + 18))" text-anchor="middle" font-size="11">\#(label(x))</text>"# + "\n"
        }
        for y in ticks(yMin, yMax, log: logY, preferred: []) {
            out += #"<line x1="\#(fmt(left))" y1="\#(fmt(py(y)))" x2="\#(fmt(right))" y2="\#(fmt(py(y)))" stroke="lightgray"/>"#
            out += #"<text x="\#(fmt(left - 6))" y="\#(fmt(py(y) + 4))" text-anchor="end" font-size="11">\#(label(y))</text>"# + "\n"
        }
        out += #"<text x="\#(fmt((left + right) / 2))" y="\#(fmt(panelHeight - 22))" text-anchor="middle" font-size="12">\#(escape(xLabel))\#(logX ? " (log scale)" : "")</text>"# + "\n"
        out += #"<text transform="translate(18,\#(fmt((top + bottom) / 2))) rotate(-90)" text-anchor="middle" font-size="12">\#(escape(yLabel))\#(logY ? " (log scale)" : "")</text>"# + "\n"
        for (i, s) in series.enumerated() {
            let path = s.points.map { "\(fmt(px($0.x))),\(fmt(py($0.y)))" }.joined(separator: " ")
            out += #"<polyline points="\#(path)" fill="none" stroke="\#(s.color)" stroke-width="2"/>"# + "\n"
            for p in s.points {
                out += #"<circle cx="\#(fmt(px(p.x)))" cy="\#(fmt(py(p.y)))" r="3" fill="\#(s.color)"><title>\#(escape(s.name)): \#(label(p.x)) → \#(label(p.y))</title></circle>"# + "\n"
            }
            let ly = top + 8 + Double(i) * 16
            out += #"<line x1="\#(fmt(left + 12))" y1="\#(fmt(ly))" x2="\#(fmt(left + 32))" y2="\#(fmt(ly))" stroke="\#(s.color)" stroke-width="2"/>"#
            out += #"<text x="\#(fmt(left + 38))" y="\#(fmt(ly + 4))" font-size="11">\#(escape(s.name))</text>"# + "\n"
        }
        return out
    }

    static func range(_ values: [Double], log: Bool, zeroBased: Bool) -> (Double, Double) {
        guard var lo = values.min(), var hi = values.max() else { return (0, 1) }
        if log {
            lo = pow(10, floor(log10(max(lo, 1e-9))))
            hi = pow(10, ceil(log10(max(hi, 1e-9))))
            if hi <= lo { hi = lo * 10 }
            return (lo, hi)
        }
        if zeroBased { lo = 0 }
        if hi <= lo { hi = lo + 1 }
        return (lo, hi * (zeroBased ? 1.1 : 1))
    }

    /// Tick values: the data's own x values on a log axis (e.g. 2, 4, 8 peers), else decades or ~5 round steps.
    static func ticks(_ lo: Double, _ hi: Double, log: Bool, preferred: Set<Double>) -> [Double] {
        if !preferred.isEmpty { return preferred.sorted() }
        if log {
            var t: [Double] = []
            var v = lo
            while v <= hi * 1.0001 && t.count < 20 { t.append(v); v *= 10 }
            return t
        }
        let raw = (hi - lo) / 5
        let magnitude = pow(10, floor(log10(raw)))
        let step = [1.0, 2, 5, 10].map { $0 * magnitude }.first { $0 >= raw } ?? raw
        var t: [Double] = []
        var v = (lo / step).rounded(.up) * step
        while v <= hi && t.count < 20 { t.append(v); v += step }
        return t
    }

    static func label(_ v: Double) -> String {
        switch abs(v) {
        case 1e9...: return fmt(v / 1e9) + "G"
        case 1e6...: return fmt(v / 1e6) + "M"
        case 1e4...: return fmt(v / 1e3) + "k"
        default: return fmt(v)
        }
    }

    static func fmt(_ v: Double) -> String {
        v == v.rounded() && abs(v) < 1e15 ? String(Int(v)) : String(format: "%.1f", v)
    }

    static func escape(_ s: String) -> String {
        s.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;").replacingOccurrences(of: ">", with: "&gt;")
    }
}
