import Foundation

/// The result of running a command to completion.
public struct CommandResult: Sendable {
    public let status: Int32
    public let stdout: String
    public let stderr: String
}

/// Runs `executable` with `arguments`, waits at most `timeout`, and captures its output.
public func runCommand(_ executable: String, _ arguments: [String], environment: [String: String]? = nil,
                       timeout: Duration = .seconds(60)) throws -> CommandResult {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: executable)
    process.arguments = arguments
    if let environment { process.environment = environment }
    let out = Pipe()
    let err = Pipe()
    process.standardOutput = out
    process.standardError = err
    process.standardInput = FileHandle.nullDevice
    try process.run()
    // Drain both pipes concurrently so a chatty child cannot block on a full pipe.
    let outData = LockedData()
    let errData = LockedData()
    let readers = [(out, outData), (err, errData)].map { pipe, sink in
        Thread { sink.set(pipe.fileHandleForReading.readDataToEndOfFile()) }
    }
    readers.forEach { $0.start() }
    let deadline = ContinuousClock.now + timeout
    while process.isRunning && ContinuousClock.now < deadline { usleep(5_000) }
    if process.isRunning {
        kill(process.processIdentifier, SIGKILL)
    }
    process.waitUntilExit()
    let readDeadline = ContinuousClock.now + .seconds(5)
    while (!outData.done || !errData.done) && ContinuousClock.now < readDeadline { usleep(1_000) }
    return CommandResult(status: process.terminationStatus,
                         stdout: String(decoding: outData.value, as: UTF8.self),
                         stderr: String(decoding: errData.value, as: UTF8.self))
}

final class LockedData: @unchecked Sendable {
    private let lock = NSLock()
    private var data = Data()
    private var finished = false
    func set(_ value: Data) { lock.withLock { data = value; finished = true } }
    var value: Data { lock.withLock { data } }
    var done: Bool { lock.withLock { finished } }
}
