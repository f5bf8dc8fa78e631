// What apps use, and nothing else: `import PeerSync` re-exports the modules below, whose public
// declarations are the app-facing API (records and values, sync configuration and status,
// devices and invites); everything else in them is `package` (visible to this package's CLI,
// examples, benchmarks and tests only). Scripts/api-check.sh counts the public types against the
// budget in docs/api-budget. The wire format, discovery and the store stay internal; of the wire
// format only the close codes a session ends with are public (``SessionEndReason``).
@_exported import PeerSyncCRDT
@_exported import PeerSyncModel
@_exported import PeerSyncStore
@_exported import PeerSyncReplication
@_exported import PeerSyncNetwork
@_exported import PeerSyncIdentity
@_exported import enum PeerSyncWire.CloseReason

/// The PeerSync toolkit: replicate app data between devices on a LAN, with no server.
public enum PeerSync {
    /// The toolkit's version.
    public static let version = "0.1.0"
}
