import Foundation

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

// The C calls under names the methods below do not shadow (`kill(_:)` is one of them).
private func systemKill(_ pid: pid_t, _ signal: Int32) -> Int32 { kill(pid, signal) }
private func systemRead(_ fd: Int32, _ buffer: UnsafeMutableRawPointer?, _ count: Int) -> Int { read(fd, buffer, count) }

/// A child process whose standard output a test reads line by line, with deadlines.
/// Stop it with ``kill(_:)`` or ``wait(timeout:)``; `deinit` kills it if it still runs.
public final class ChildProcess: @unchecked Sendable {
    public let process = Process()
    private let stdout = Pipe()
    private let stderr: Pipe?
    private var buffer = Data()
    private var eof = false

    /// Starts `executable` (a path) with `arguments`.
    /// With `captureStandardError`, the child's stderr is kept for ``standardErrorLines()``
    /// (read it after the child exited); otherwise it goes to the test's stderr.
    public init(_ executable: String, _ arguments: [String], environment: [String: String]? = nil,
                captureStandardError: Bool = false) throws {
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        if let environment { process.environment = environment }
        process.standardOutput = stdout
        stderr = captureStandardError ? Pipe() : nil
        process.standardError = stderr ?? FileHandle.standardError
        try process.run()
    }

    /// The child's standard error, as lines (only with `captureStandardError`, after it exited).
    public func standardErrorLines() -> [String] {
        guard let stderr, !process.isRunning else { return [] }
        let data = stderr.fileHandleForReading.readDataToEndOfFile()
        return String(decoding: data, as: UTF8.self).split(separator: "\n").map(String.init)
    }

    deinit {
        if process.isRunning {
            _ = systemKill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    public var pid: Int32 { process.processIdentifier }

    /// The next line of output, or nil at end of output or when `deadline` passes.
    public func readLine(until deadline: ContinuousClock.Instant) -> String? {
        while true {
            if let newline = buffer.firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: buffer[buffer.startIndex..<newline], as: UTF8.self)
                buffer = Data(buffer[(newline + 1)...])
                return line
            }
            if eof { return nil }
            let remaining = deadline - .now
            guard remaining > .zero else { return nil }
            let ms = Int32(min(remaining.components.seconds * 1_000 + remaining.components.attoseconds / 1_000_000_000_000_000, 1_000))
            var pfd = pollfd(fd: stdout.fileHandleForReading.fileDescriptor, events: Int16(POLLIN), revents: 0)
            let ready = poll(&pfd, 1, max(ms, 1))
            if ready > 0 {
                var chunk = [UInt8](repeating: 0, count: 65_536)
                let n = systemRead(pfd.fd, &chunk, chunk.count)
                if n <= 0 { eof = true } else { buffer.append(contentsOf: chunk[0..<n]) }
            }
        }
    }

    /// Sends `signal` and reaps the process.
    public func kill(_ signal: Int32 = SIGKILL) {
        _ = systemKill(process.processIdentifier, signal)
        process.waitUntilExit()
    }

    /// Waits for the process to exit by itself; kills it after `timeout`. Returns its exit status.
    @discardableResult
    public func wait(timeout: Duration) -> Int32 {
        let deadline = ContinuousClock.now + timeout
        while process.isRunning && ContinuousClock.now < deadline {
            _ = readLine(until: min(deadline, .now + .milliseconds(50)))
        }
        if process.isRunning { kill() } else { process.waitUntilExit() }
        return process.terminationStatus
    }
}

/// The directory of the test binary, where `swift build` also puts the helper executables.
public func buildProductsDirectory() -> URL {
    URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
}

/// A new empty temporary directory; removed by ``removeTemporaryDirectory(_:)``.
public func makeTemporaryDirectory(_ label: String = "peersync-test") throws -> String {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("\(label)-\(UUID().uuidString)").path
    try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    return path
}

public func removeTemporaryDirectory(_ path: String) {
    try? FileManager.default.removeItem(atPath: path)
}
