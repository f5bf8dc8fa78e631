// What apps use: values and records (CRDT, Model), the store the replica opens (Store), and the
// sync configuration, sessions and events (Session). Discovery and the wire format stay
// internal; `peersync doctor` imports discovery itself.
@_exported import PeerSyncCRDT
@_exported import PeerSyncModel
@_exported import PeerSyncStore
@_exported import PeerSyncReplication
@_exported import PeerSyncNetwork
@_exported import PeerSyncIdentity

/// The PeerSync toolkit: replicate app data between devices on a LAN, with no server.
public enum PeerSync {
    /// The toolkit's version.
    public static let version = "0.1.0"
}
