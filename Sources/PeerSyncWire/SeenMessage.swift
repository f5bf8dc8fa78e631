@_spi(Engine) import PeerSyncCRDT

// The compaction gossip message (docs/PROTOCOL.md §19): type 16, its body a list of signed
// reports, no fields — like `delta`. Not a case of `Message`: only a peer whose hello announced
// ``HelloFeatures/signedReports`` may receive it (older peers close a session on an unknown type,
// or read the unsigned form 01 of an earlier version), so the session core sends and reads it.
//
// ```
// body = 02 varint(n) n × (varint(len) report(len))     replica IDs strictly ascending, n ≤ 10,000
// ```
package enum SeenMessage {
    /// Frame type of `seen`.
    package static let kind: UInt8 = 16
    /// The body's format byte (01 was the unsigned gossip of the previous version).
    package static let format: UInt8 = 2

    /// The body carrying `reports` (sorted by replica ID here).
    package static func encodedBody(_ reports: [SeenReport]) -> [UInt8] {
        var out: [UInt8] = [format]
        let sorted = reports.sorted { $0.replica < $1.replica }
        Varint.append(UInt64(sorted.count), to: &out)
        for report in sorted {
            let bytes = report.bytes
            Varint.append(UInt64(bytes.count), to: &out)
            out += bytes
        }
        return out
    }

    /// The frame of a `seen` message.
    package static func encodedFrame(_ reports: [SeenReport]) -> [UInt8] {
        Frame.encode(type: kind, body: encodedBody(reports))
    }

    /// Reads a `seen` body: refuses (as malformed) another format byte, more reports than
    /// ``ValidationLimits/maxContextReplicas``, replica IDs not strictly ascending, a report that
    /// does not decode (``SeenReport/init(bytes:)``), and trailing bytes. Signatures are checked
    /// by the receiver against its roster.
    package static func decode(body: [UInt8]) throws(WireError) -> [SeenReport] {
        func malformed(_ detail: String) -> WireError { .malformed(message: "seen", detail: detail) }
        guard let first = body.first else { throw malformed("empty body") }
        guard first == format else { throw malformed("format \(first) (this node reads signed reports, format \(format))") }
        var index = 1
        func varint(_ what: String) throws(WireError) -> UInt64 {
            var value: UInt64 = 0
            var shift: UInt64 = 0
            while true {
                guard index < body.count else { throw malformed("truncated \(what)") }
                let byte = body[index]
                index += 1
                guard shift < 64 else { throw malformed("\(what): varint too long") }
                value |= UInt64(byte & 0x7f) << shift
                if byte & 0x80 == 0 { return value }
                shift += 7
            }
        }
        let count = try varint("report count")
        guard count <= UInt64(ValidationLimits.maxContextReplicas) else {
            throw malformed("\(count) reports (limit \(ValidationLimits.maxContextReplicas))")
        }
        guard count <= UInt64(body.count - index) else { throw malformed("\(count) reports in \(body.count - index) bytes") }
        var reports: [SeenReport] = []
        reports.reserveCapacity(Int(count))
        for _ in 0..<count {
            let length = try varint("report length")
            guard length <= UInt64(body.count - index) else { throw malformed("truncated report") }
            let report: SeenReport
            do {
                report = try SeenReport(bytes: Array(body[index..<(index + Int(length))]))
            } catch {
                throw malformed("\(error)")
            }
            index += Int(length)
            if let last = reports.last, !(last.replica < report.replica) { throw malformed("reports not in ascending replica order") }
            reports.append(report)
        }
        guard index == body.count else { throw malformed("\(body.count - index) trailing bytes") }
        return reports
    }
}
