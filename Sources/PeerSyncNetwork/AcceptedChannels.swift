import PeerSyncReplication
import NIOCore
import Synchronization

/// Accepted connections between NIO's child initializer and the accept loop.
///
/// NIO traps (`preconditionFailure`, release builds too) when an accepted `NIOAsyncChannel` is
/// dropped without being closed. That happens when a connection's initializer completes after
/// the listener's stream has ended — a peer dialing while the node stops (a test run crashed
/// so, in NIO's `NIOAsyncWriter` deinit). So every accepted channel is registered here until
/// the accept loop takes it; once ``close()`` has run, new ones are refused (the initializer
/// throws, NIO closes the connection, and no `NIOAsyncChannel` exists), and the node closes
/// the ones that were registered but never taken.
final class AcceptedChannels: Sendable {
    typealias Connection = NIOAsyncChannel<[InboundFrame], ByteBuffer>

    struct Closed: Error, CustomStringConvertible {
        var description: String { "the node is stopping" }
    }

    private struct State {
        var closed = false
        var pending: [ObjectIdentifier: Connection] = [:]
    }

    private let state = Mutex(State())

    /// Runs `make` (the pipeline's set-up, which creates the `NIOAsyncChannel`) and keeps what
    /// it made until ``take(_:)``; throws ``Closed`` without running it once closed.
    func register<Extra>(_ make: () throws -> (Connection, Extra)) throws -> (Connection, Extra) {
        try state.withLock { state in
            guard !state.closed else { throw Closed() }
            let made = try make()
            state.pending[ObjectIdentifier(made.0.channel)] = made.0
            return made
        }
    }

    /// The accept loop has `connection`: it closes it itself.
    func take(_ connection: Connection) {
        state.withLock { _ = $0.pending.removeValue(forKey: ObjectIdentifier(connection.channel)) }
    }

    /// Refuses every later connection; returns those registered and never taken (the caller
    /// closes them).
    func close() -> [Connection] {
        state.withLock { state in
            state.closed = true
            defer { state.pending = [:] }
            return Array(state.pending.values)
        }
    }

    /// Connections registered and not taken (tests).
    var pendingCount: Int { state.withLock { $0.pending.count } }
}
