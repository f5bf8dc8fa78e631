import PeerSync
import Synchronization

/// Two replicas linked in-process through the app-transport session API
/// (`Replica.openSession`), the way an app runs its own transport: each side's messages go to
/// the other's `receive`, in order; when one side's session ends, the other is told its
/// transport closed; and while the link is up, a new "connection" (new sessions, a new pipe)
/// replaces one whose sessions ended — as the TCP dialer redials. A session over an app's
/// transport can end while the transport stays up: a handshake or dead-peer timeout on a loaded
/// machine, a refusal that says "try again". Without a reconnect the replicas stay apart.
public final class PipeLink: Sendable {
    private struct State {
        var closed = false
        var sessions: (SyncSession, SyncSession)?
        var connections = 0
    }
    private let state = Mutex(State())
    private let loop = Mutex<Task<Void, Never>?>(nil)

    /// How many connections the link has made (1 until a session ended and was replaced).
    public var connections: Int { state.withLock { $0.connections } }

    /// Links `initiator` (which opens the session) and `acceptor`; returns at once. At most
    /// `maxConnections` connections, with a backoff between them; the link lives until
    /// ``close()``, or until a replica stops syncing (no session opens then).
    public init(_ initiator: Replica, _ acceptor: Replica, maxConnections: Int = 100) {
        let task = Task { [self] in
            for attempt in 0..<maxConnections {
                guard !self.state.withLock({ $0.closed }),
                      let a = try? await initiator.openSession(address: "pipe:\(acceptor.replicaID.shortDescription)", initiator: true),
                      let b = try? await acceptor.openSession(address: "pipe:\(initiator.replicaID.shortDescription)", initiator: false)
                else { return }
                let closedMeanwhile = self.state.withLock { s -> Bool in
                    s.sessions = (a, b)
                    s.connections += 1
                    return s.closed
                }
                if closedMeanwhile { await a.close() }
                await withDiscardingTaskGroup { group in
                    group.addTask { await Self.pump(from: a, to: b) }
                    group.addTask { await Self.pump(from: b, to: a) }
                }
                guard !self.state.withLock({ $0.closed }) else { return }
                // A backoff between connections (not a synchronisation): 50 ms, growing to 1 s.
                try? await Task.sleep(for: .milliseconds(50 * min(attempt + 1, 20)))
            }
        }
        loop.withLock { $0 = task }
    }

    /// Ends the link: a goodbye from the initiator's side, then waits until both pumps stopped.
    public func close() async {
        let sessions = state.withLock { s -> (SyncSession, SyncSession)? in
            s.closed = true
            return s.sessions
        }
        if let (a, _) = sessions { await a.close() }
        let task = loop.withLock { $0 }
        task?.cancel()  // only cuts a backoff short
        await task?.value
    }

    private static func pump(from: SyncSession, to: SyncSession) async {
        while let message = await from.nextMessage() { await to.receive(message) }
        await to.transportClosed()  // the connection is gone for the other side too
    }
}
