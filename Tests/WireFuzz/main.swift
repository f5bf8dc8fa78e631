@_spi(Engine) import PeerSyncCRDT
import PeerSyncWire

// libFuzzer entry point for the frame, message and delta decoders. Build and run with
// Scripts/fuzz.sh. Every input is split into frames; each frame is decoded as a message, and
// delta/chunk payloads through a session dictionary, exactly as a node does on receipt.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzWireDecoders(_ data: UnsafeRawPointer, _ size: Int) -> CInt {
    let bytes = Array(UnsafeRawBufferPointer(start: data, count: size))
    var splitter = FrameSplitter(maxFrameBytes: 1 << 16)
    splitter.append(bytes)
    let dictionary = WireDictionary(startingAt: 1_700_000_000_000)
    while let frame = try? splitter.next() {
        guard let message = try? Message.decode(type: frame.type, body: frame.body) else { continue }
        switch message {
        case .delta(let payload), .chunk(_, _, _, let payload, _):
            if let delta = try? WireDelta.decode(payload, with: dictionary) {
                // Whatever decodes must be a state the join laws hold on.
                precondition(delta.merged(with: delta) == delta, "decoded delta is not idempotent")
                _ = delta.encoded()
            }
        default:
            break
        }
    }
    _ = try? RecordMap(decoding: bytes)
    _ = try? FieldValue(decoding: bytes)
    return 0
}
