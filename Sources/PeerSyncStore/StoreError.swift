import GRDB
@_spi(Engine) import PeerSyncCRDT

/// Why a store could not be opened, read or written. Each case names the file and says what a
/// person can do; ``description`` is one line for a terminal.
package enum StoreError: Error, Equatable, CustomStringConvertible {
    /// No replica at this directory.
    case missing(directory: String)
    /// The directory already holds a replica.
    case alreadyExists(directory: String, replicaID: String)
    /// The file is not an SQLite database, or an SQLite database that is not a PeerSync store.
    case notAStore(path: String, detail: String)
    /// SQLite or PeerSync found damaged data.
    case corrupt(path: String, detail: String)
    /// A newer PeerSync wrote this store (migrations this version does not know).
    case newerFormat(path: String, unknownMigrations: [String])
    case readOnly(path: String)
    case diskFull(path: String)
    /// Another process held the store locked for longer than the busy timeout.
    case busy(path: String)
    case cannotOpen(path: String, detail: String)
    case io(path: String, detail: String)
    /// A change broke a bound of ``ValidationLimits`` (e.g. a remote delta whose join would
    /// take the replica's context past 10,000 replicas); nothing was written.
    case refused(path: String, detail: String)
    /// The store was closed (``ReplicaStore/close()``); nothing was written.
    case closed(path: String)

    public var description: String {
        switch self {
        case .missing(let directory):
            "no replica at \(directory) (create one with `peersync init`, or pass --store)"
        case .alreadyExists(let directory, let replicaID):
            "\(directory) already holds replica \(replicaID); use another --store directory"
        case .notAStore(let path, let detail):
            "\(path) is not a PeerSync store (\(detail)); point --store at a replica directory"
        case .corrupt(let path, let detail):
            "\(path) is corrupt (\(detail)); restore it from a backup, or re-create the replica and resync from a peer"
        case .newerFormat(let path, let unknown):
            "\(path) was written by a newer PeerSync (unknown migrations: \(unknown.joined(separator: ", "))); upgrade peersync to open it"
        case .readOnly(let path):
            "\(path) is read-only; make the file and its directory writable"
        case .diskFull(let path):
            "the disk holding \(path) is full; free some space and try again (nothing was written)"
        case .busy(let path):
            "\(path) stayed locked by another process for over 10 s; try again"
        case .cannotOpen(let path, let detail):
            "cannot open \(path): \(detail)"
        case .io(let path, let detail):
            "input/output error on \(path): \(detail)"
        case .refused(let path, let detail):
            "refused a change to \(path): \(detail); nothing was written"
        case .closed(let path):
            "\(path) was closed; open the replica again to change it (nothing was written)"
        }
    }

    /// Wraps errors from SQLite, GRDB or decoding as a `StoreError` about `path`; returns any
    /// other error (one a caller's closure threw) unchanged.
    static func wrapIfStorage(_ error: any Error, path: String) -> any Error {
        switch error {
        case is StoreError, is BinaryDecodingError, is DatabaseError, is LimitViolationError: wrap(error, path: path)
        default: error
        }
    }

    /// Wraps any error from SQLite, GRDB or decoding as a `StoreError` about `path`.
    static func wrap(_ error: any Error, path: String) -> StoreError {
        if let error = error as? StoreError { return error }
        if let error = error as? BinaryDecodingError { return .corrupt(path: path, detail: "stored data: \(error)") }
        if let error = error as? LimitViolationError { return .refused(path: path, detail: error.description) }
        if let error = error as? DatabaseError {
            let detail = error.message ?? "\(error.resultCode)"
            switch error.resultCode.primaryResultCode {
            case .SQLITE_NOTADB: return .notAStore(path: path, detail: "not an SQLite database")
            case .SQLITE_CORRUPT: return .corrupt(path: path, detail: detail)
            case .SQLITE_READONLY: return .readOnly(path: path)
            case .SQLITE_FULL: return .diskFull(path: path)
            case .SQLITE_BUSY, .SQLITE_LOCKED: return .busy(path: path)
            case .SQLITE_CANTOPEN: return .cannotOpen(path: path, detail: detail)
            case .SQLITE_PERM, .SQLITE_AUTH: return .readOnly(path: path)
            case .SQLITE_IOERR:
                if error.extendedResultCode == .SQLITE_IOERR_WRITE || error.extendedResultCode == .SQLITE_IOERR_FSYNC {
                    return .io(path: path, detail: "\(detail) (is the disk full?)")
                }
                return .io(path: path, detail: detail)
            default: return .io(path: path, detail: detail)
            }
        }
        return .io(path: path, detail: "\(error)")
    }
}
