import Logging
import Synchronization

/// A swift-log handler that keeps every line (message and metadata) for assertions.
public struct RecordingLogHandler: LogHandler {
    public final class Lines: Sendable {
        private let lines = Mutex<[String]>([])
        public init() {}
        func append(_ line: String) { lines.withLock { $0.append(line) } }
        public var all: [String] { lines.withLock { $0 } }
    }

    public let lines: Lines
    public var metadata: Logger.Metadata = [:]
    public var logLevel: Logger.Level

    public init(lines: Lines, level: Logger.Level = .debug) {
        self.lines = lines
        logLevel = level
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(event: LogEvent) {
        let all = metadata.merging(event.metadata ?? [:]) { $1 }
        lines.append("\(event.level) \(event.message) " + all.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " "))
    }

    /// A logger writing into `lines`.
    public static func logger(_ label: String, into lines: Lines, level: Logger.Level = .debug) -> Logger {
        Logger(label: label) { _ in RecordingLogHandler(lines: lines, level: level) }
    }
}
