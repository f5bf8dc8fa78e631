@_exported import PeerSyncCRDT
@_exported import PeerSyncModel
@_exported import PeerSyncStore
@_exported import PeerSyncSession
@_exported import PeerSyncDiscovery

/// The PeerSync toolkit: replicate app data between devices on a LAN, with no server.
public enum PeerSync {
    /// The toolkit's version.
    public static let version = "0.1.0"
}
