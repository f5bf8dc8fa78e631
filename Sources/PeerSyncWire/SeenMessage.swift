import PeerSyncCRDT

// The compaction gossip message (docs/PROTOCOL.md §19): type 16, its body a seen blob
// (``SeenContexts/encodedBlob()``), no fields — like `delta`. Not a case of `Message`: only a
// peer whose hello announced ``HelloFeatures/seenGossip`` may receive it (older peers close a
// session on an unknown type), so the session core sends and reads it itself.
public enum SeenMessage {
    /// Frame type of `seen`.
    public static let kind: UInt8 = 16

    /// The frame of a `seen` message.
    public static func encodedFrame(_ seen: SeenContexts) -> [UInt8] {
        Frame.encode(type: kind, body: seen.encodedBlob())
    }

    /// Reads a `seen` body: refuses (as malformed) another version byte, more reports than
    /// ``ValidationLimits/maxContextReplicas``, replica IDs not strictly ascending, a context
    /// past the context limits, and trailing bytes.
    public static func decode(body: [UInt8]) throws(WireError) -> SeenContexts {
        do {
            return try SeenContexts(blob: body)
        } catch {
            throw .malformed(message: "seen", detail: "\(error)")
        }
    }
}
