#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// fsyncs the file at `path`; returns 0 or the errno of what failed (ENOENT if it is missing).
func syncFile(_ path: String) -> Int32 {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { return errno }
    defer { _ = close(fd) }
    #if canImport(Darwin)
    // fsync on Apple platforms does not reach the medium; F_FULLFSYNC does (as SQLite's fullfsync).
    if fcntl(fd, F_FULLFSYNC) == 0 { return 0 }
    #endif
    #if os(Linux)
    // fdatasync, as SQLite itself uses: the data and the size, not the timestamps (an fsync
    // here cost 1 ms per commit on ext4 against 0.3 ms for fdatasync; BENCHMARKS, store-edit).
    return fdatasync(fd) == 0 ? 0 : errno
    #else
    return fsync(fd) == 0 ? 0 : errno
    #endif
}
