@_spi(Engine) import PeerSyncCRDT
import PeerSyncTestSupport
@testable import PeerSyncWire
import Testing

@Suite("Attachment messages and the hello's features")
struct AttachmentWireTests {
    func hello(features: HelloFeatures) -> Hello {
        Hello(replicaID: testReplica(1), name: "laptop", wallClockMilliseconds: 1_700_000_000_000, context: CausalContext(),
              digest: .empty, groupID: [UInt8](repeating: 1, count: 16), deviceKey: [UInt8](repeating: 4, count: 65),
              nonce: [UInt8](repeating: 2, count: 16), features: features)
    }

    @Test("a hello announces attachments in field 11; without features it encodes as before")
    func helloFeatures() throws {
        let with = Message.hello(hello(features: .attachments))
        #expect(try Message.decode(type: 1, body: with.body()) == with)
        let without = Message.hello(hello(features: []))
        #expect(try Message.decode(type: 1, body: without.body()) == without)
        // Field 11 (key 0x58) is absent without features, present (varint 1) with them.
        #expect(with.body() == without.body() + [0x58, 0x01])
        // Unknown feature bits from a newer peer are kept, not refused.
        var future = hello(features: HelloFeatures(rawValue: 0b110))
        future.features.insert(.attachments)
        #expect(try Message.decode(type: 1, body: Message.hello(future).body()) == .hello(future))
    }

    @Test("attachment messages use frame types 13–15, which are not Message kinds (unknown to a node without the feature)")
    func kinds() {
        #expect(AttachmentWireLimits.requestKind == 13 && AttachmentWireLimits.dataKind == 14 && AttachmentWireLimits.unavailableKind == 15)
        for type in AttachmentWireLimits.kinds {
            #expect(Message.Kind(rawValue: type) == nil)
            #expect(throws: WireError.unknownMessageType(type)) { try Message.decode(type: type, body: []) }
        }
    }

    @Test("a full data message fits a frame of its payload plus the stated overhead")
    func dataOverhead() {
        let payload = [UInt8](repeating: 0xAB, count: 65_536 - AttachmentWireLimits.dataFrameOverhead)
        let body = encodeAttachmentData(AttachmentDataBody(hash: [UInt8](repeating: 1, count: 32), offset: UInt64(1) << 32 - 1,
                                                           total: UInt64(1) << 32, bytes: payload))
        #expect(Frame.encode(type: AttachmentWireLimits.dataKind, body: body).count <= 65_536)
    }
}
