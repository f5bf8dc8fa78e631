@_spi(Engine) import PeerSyncCRDT
import PeerSyncIdentity
import PeerSyncModel
import PeerSyncStore

/// What can go wrong in a ``Replica`` call: its throwing methods, opening, creating and joining
/// throw only this, so an app can switch over it. Each case's ``description`` is one line that
/// says what happened and what to do: the text of the error underneath (the store's, the device
/// key's, the limit's), unchanged.
public enum ReplicaError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The store could not be opened, read or written: no replica there, one already there,
    /// a damaged or read-only file, a full disk, a store written by a newer version, or another
    /// process holding it locked. The text names the file and what to do.
    case storage(String)
    /// The device key in the replica's directory is missing, unreadable, damaged or readable by
    /// other users. The text names the file.
    case deviceKey(String)
    /// A record or setting could not be written or read as its type: a value over a bound
    /// (a string or list too long, too many fields), or a stored field whose type does not match
    /// the record's property. Nothing was written.
    case invalidRecord(String)
    /// A device, invite or roster operation was refused (not an admin, an unknown device, …).
    /// Nothing was written.
    case deviceAdministration(DeviceAdministrationError)
    /// An attachment could not be added, read or purged: too large, an unreadable source file, or
    /// the attachment directory not writable.
    case attachment(String)
    /// Sync could not start: the listening address could not be bound (in use, not an address of
    /// this machine) or the network is unavailable.
    case network(String)
    /// A ``ReplicaBatch`` was used after the closure it was given to returned. Nothing was
    /// written.
    case batchClosed
    /// The record asked for is not there (never saved here, or deleted): ``Replica/update(_:id:_:)``
    /// and ``Replica/save(_:editedFrom:)`` change records that exist. Nothing was written.
    case recordNotFound(String)
    /// ``Replica/save(_:)`` was given a copy read before another device changed some of the
    /// fields it would write: saving it would put their old values back. Nothing was written.
    /// The text names the record, the fields and who changed them; write the fields the app
    /// changed with ``Replica/update(_:id:_:)`` or ``Replica/save(_:editedFrom:)``.
    case staleCopy(String)
    /// A relay could not be enrolled or used: unreachable, another relay than its code names, a
    /// wrong code, or a refusal (quota, not a member). The text says which and what to do.
    case relay(String)

    public var description: String {
        switch self {
        case .storage(let detail), .deviceKey(let detail), .invalidRecord(let detail), .attachment(let detail),
             .network(let detail), .recordNotFound(let detail), .staleCopy(let detail), .relay(let detail): detail
        case .deviceAdministration(let error): error.description
        case .batchClosed: "a batch was used after its closure returned; make every write inside the closure given to batch { … }"
        }
    }

    /// `error` as the case an app can act on; an error of no known kind becomes `otherwise`'s.
    init(_ error: any Error, otherwise: (String) -> ReplicaError) {
        switch error {
        case let error as ReplicaError: self = error
        case let error as DeviceAdministrationError: self = .deviceAdministration(error)
        case let error as StoreError: self = .storage(error.description)
        case let error as DeviceKeyError: self = .deviceKey(error.description)
        case let error as AttachmentError: self = .attachment(error.description)
        case let error as RosterEntryError: self = .deviceAdministration(.invalidEntry(error.description))
        case let error as RecordNotFoundError: self = .recordNotFound(error.description)
        case let error as RecordEditError: self = .invalidRecord(error.description)
        case is LimitViolationError, is CounterExhaustedError, is FieldValueDecodingError, is DecodingError, is EncodingError:
            self = .invalidRecord("\(error)")
        default: self = otherwise("\(error)")
        }
    }

    /// Runs `body`, throwing what it throws as a `ReplicaError` (an error of no known kind as
    /// `otherwise`'s case).
    static func wrapping<T>(otherwise: (String) -> ReplicaError = ReplicaError.storage,
                            _ body: () throws -> T) throws(ReplicaError) -> T {
        do { return try body() } catch { throw ReplicaError(error, otherwise: otherwise) }
    }

    /// Runs `body` on the caller's actor, throwing what it throws as a `ReplicaError`.
    nonisolated(nonsending) static func wrapping<T>(otherwise: (String) -> ReplicaError = ReplicaError.storage,
                                                    _ body: () async throws -> T) async throws(ReplicaError) -> T {
        do { return try await body() } catch { throw ReplicaError(error, otherwise: otherwise) }
    }
}
