import NIOCore
import NIOEmbedded
@testable import PeerSyncReplication
@testable import PeerSyncNetwork
import Testing

/// Accepted connections are kept from NIO's child initializer until the accept loop takes them,
/// so a node that stops while a peer dials closes them instead of dropping them (NIO traps on
/// a dropped `NIOAsyncChannel`).
@Suite("Accepted channels")
struct AcceptedChannelsTests {
    @Test("what the loop never took is handed back on close; after close nothing is set up")
    func closeHandsBackWhatWasNotTaken() async throws {
        let accepted = AcceptedChannels()
        // As NIO's child initializer does: on the connection's event loop.
        func accept() async throws -> AcceptedChannels.Connection {
            let channel = NIOAsyncTestingChannel()
            return try await channel.eventLoop.submit {
                try accepted.register { (try NIOAsyncChannel(wrappingChannelSynchronously: channel), ()) }.0
            }.get()
        }
        let taken = try await accept()
        let dropped = try await accept()
        accepted.take(taken)
        #expect(accepted.pendingCount == 1)
        let leftovers = accepted.close()
        #expect(leftovers.map { ObjectIdentifier($0.channel) } == [ObjectIdentifier(dropped.channel)])
        #expect(accepted.pendingCount == 0)
        await #expect(throws: AcceptedChannels.Closed.self) { _ = try await accept() }
        // Closed as the accept loop and `stop()` close them (NIO traps on one dropped open).
        for connection in [taken] + leftovers { try await connection.executeThenClose { _, _ in } }
    }
}
