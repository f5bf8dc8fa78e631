#if canImport(Glibc)
import Glibc
#endif

/// A child process started with `posix_spawn`, whose standard output is read line by line with
/// deadlines, and whose exit is detected with `waitpid(WNOHANG)`.
///
/// Not `Foundation.Process`: on Linux that detects a child's exit through a socket inherited by
/// the child, so it never sees the exit of a script that left daemons behind holding it, and its
/// `waitUntilExit()` has no timeout. Every wait here is bounded. Standard input is /dev/null,
/// standard error is the test's; no other descriptor of the test process is passed down.
final class LabProcess {
    let pid: pid_t
    private let outputFD: Int32
    private var buffer: [UInt8] = []
    private var reachedEOF = false
    private var status: Int32?

    struct SpawnError: Error, CustomStringConvertible {
        let description: String
    }

    init(_ executable: String, _ arguments: [String], environment: [String: String]) throws {
        var fds: [Int32] = [-1, -1]
        guard pipe(&fds) == 0 else { throw SpawnError(description: "pipe failed: errno \(errno)") }
        _ = fcntl(fds[0], F_SETFD, FD_CLOEXEC)

        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, fds[1], 1)
        posix_spawn_file_actions_addclose(&actions, fds[1])
        LabProcess.closeOtherDescriptors(&actions)

        let argv = ([executable] + arguments).map { strdup($0) } + [nil]
        let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            argv.forEach { free($0) }
            envp.forEach { free($0) }
        }
        var pid: pid_t = 0
        let result = posix_spawn(&pid, executable, &actions, nil, argv, envp)
        close(fds[1])
        guard result == 0 else {
            close(fds[0])
            throw SpawnError(description: "posix_spawn \(executable) failed: \(result)")
        }
        self.pid = pid
        self.outputFD = fds[0]
    }

    deinit {
        if !hasExited {
            kill(pid, SIGKILL)
            _ = waitForExit(timeout: .seconds(5))
        }
        close(outputFD)
    }

    /// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34+), looked up at run time because
    /// the Glibc module does not export it. Without it, only close-on-exec descriptors stay behind.
    private static func closeOtherDescriptors(_ actions: inout posix_spawn_file_actions_t) {
        typealias CloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np")
        else { return }
        _ = unsafeBitCast(symbol, to: CloseFrom.self)(&actions, 3)
    }

    /// Whether the process has exited (reaping it if so).
    var hasExited: Bool {
        reap()
        return status != nil
    }

    /// The exit status (128 + signal number if killed by a signal), once it has exited.
    var exitStatus: Int32? {
        reap()
        return status
    }

    private func reap() {
        guard status == nil else { return }
        var raw: Int32 = 0
        let result = waitpid(pid, &raw, WNOHANG)
        if result == pid {
            status = raw & 0x7f == 0 ? (raw >> 8) & 0xff : 128 + (raw & 0x7f)
        } else if result < 0 && errno == ECHILD {
            status = -1
        }
    }

    /// The next line of output, or nil at end of output or when `deadline` passes.
    func readLine(until deadline: ContinuousClock.Instant) -> String? {
        while true {
            if let newline = buffer.firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: buffer[..<newline], as: UTF8.self)
                buffer.removeSubrange(...newline)
                return line
            }
            if reachedEOF { return nil }
            let remaining = deadline - .now
            guard remaining > .zero else { return nil }
            fill(waitingAtMost: min(remaining, .seconds(1)))
        }
    }

    /// Reads what is available, waiting at most `limit` for something to arrive.
    private func fill(waitingAtMost limit: Duration) {
        let (seconds, attoseconds) = limit.components
        let milliseconds = Int32(seconds * 1_000 + attoseconds / 1_000_000_000_000_000)
        var descriptor = pollfd(fd: outputFD, events: Int16(POLLIN), revents: 0)
        guard poll(&descriptor, 1, max(milliseconds, 1)) > 0 else { return }
        var chunk = [UInt8](repeating: 0, count: 65_536)
        let count = read(outputFD, &chunk, chunk.count)
        if count > 0 {
            buffer.append(contentsOf: chunk[0..<count])
        } else if count == 0 || (errno != EINTR && errno != EAGAIN) {
            reachedEOF = true
        }
    }

    /// Waits until the process exits or `timeout` passes (output keeps being buffered meanwhile).
    /// Returns the exit status, or nil if it still runs.
    func waitForExit(timeout: Duration) -> Int32? {
        let deadline = ContinuousClock.now + timeout
        while true {
            if let status = exitStatus { return status }
            if ContinuousClock.now >= deadline { return nil }
            if reachedEOF {
                _ = poll(nil, 0, 10)  // output closed but not yet exited: check again in 10 ms
            } else {
                fill(waitingAtMost: .milliseconds(10))
            }
        }
    }

    /// SIGTERM, up to `grace` to exit, then SIGKILL. Returns the exit status.
    @discardableResult
    func terminate(grace: Duration = .seconds(10)) -> Int32 {
        if let status = exitStatus { return status }
        kill(pid, SIGTERM)
        if let status = waitForExit(timeout: grace) { return status }
        kill(pid, SIGKILL)
        return waitForExit(timeout: .seconds(5)) ?? -1
    }
}
