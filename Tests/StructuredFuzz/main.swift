@_spi(Engine) import PeerSyncCRDT
import PeerSyncWire

// A structure-aware libFuzzer target (Scripts/fuzz.sh). Where peersync-wire-fuzz feeds random
// bytes to the decoders (which refuse most of them at the first byte), this one reads its
// input as a stream of *choices* and builds well-formed messages from them — hellos and acks
// with contexts, catch-up chunks, event and general deltas, nested values — mixing in the
// boundary values hostile input would use: counters 0, 1, 2⁵³, 2⁵³+1, 2⁶³, 2⁶⁴−1; huge chunk
// indices, counts and record counts; timestamps at and past the year 9999; contexts at and one
// past the replica and cloud-dot limits; values nested 63, 64 and 65 deep; empty and long
// strings. It encodes them with the real encoders, then runs them through every decoder and
// through the join, the context operations and the digest against a small existing state.
//
// Oracles (a violation traps, and libFuzzer saves the input):
// - no decoder, join, context operation, digest, clock or local write traps;
// - a value decodes (wire, context blob, record blob, journal blob) iff it is within
//   ValidationLimits — the decoders refuse exactly what `limitViolation` names;
// - whatever decodes is valid, round-trips through the store encoding, and joins idempotently;
//   a maintained digest equals a recomputed one;
// - a chunk that decodes has index < count ≤ 2³² and records ≤ its bytes (the session turns
//   them into `Int`).

// MARK: - Choices

struct Choices {
    let bytes: [UInt8]
    var position = 0

    init(_ bytes: [UInt8]) { self.bytes = bytes }

    mutating func byte() -> UInt8 {
        guard position < bytes.count else { return 0 }
        defer { position += 1 }
        return bytes[position]
    }

    /// 0..<n for n ≤ 256.
    mutating func below(_ n: Int) -> Int { n <= 1 ? 0 : Int(byte()) % n }

    mutating func chance(oneIn n: Int) -> Bool { below(n) == 0 }

    /// True for one value in `n`, never for a zero byte: the expensive shapes (a context at
    /// the limits, a deep value, a 64 KiB string) must not be what an exhausted input picks.
    mutating func rare(oneIn n: Int) -> Bool { below(n) == n - 1 }

    mutating func u64() -> UInt64 { (0..<8).reduce(UInt64(0)) { value, _ in value << 8 | UInt64(byte()) } }

    mutating func pick<T>(_ options: [T]) -> T { options[below(options.count)] }

    /// An event counter: usually small, often a boundary.
    mutating func counter() -> UInt64 {
        switch below(16) {
        case 0: 0
        case 1: 1
        case 2: ValidationLimits.maxCounter
        case 3: ValidationLimits.maxCounter + 1
        case 4: ValidationLimits.maxCounter - 1
        case 5: 1 << 63
        case 6: .max
        case 7: .max - 1
        case 8: u64()
        default: UInt64(below(40)) + 1
        }
    }

    /// A chunk index, count or record count.
    mutating func count() -> UInt64 {
        switch below(12) {
        case 0: 0
        case 1: 1
        case 2: WireLimits.maxChunksPerRound
        case 3: WireLimits.maxChunksPerRound + 1
        case 4: 1 << 63
        case 5: .max
        case 6: u64()
        default: UInt64(below(6))
        }
    }

    /// A raw HLC timestamp.
    mutating func timestamp() -> HLCTimestamp {
        let raw: UInt64 = switch below(12) {
        case 0: 0
        case 1: 1
        case 2: ValidationLimits.maxTimestamp.rawValue
        case 3: ValidationLimits.maxTimestamp.rawValue + 1
        case 4: ((1 << 48) - 1) << 16 | 0xFFFF
        case 5: .max
        case 6: u64()
        default: (1_700_000_000_000 + UInt64(below(200))) << 16 | UInt64(below(4))
        }
        return HLCTimestamp(rawValue: raw)
    }
}

// MARK: - Building values

let replicaPool = (0..<6).map { ReplicaID(high: 0x5EED, low: UInt64($0)) }
let manyNeighbors = (0..<4_097).map { ReplicaID(high: 1, low: UInt64($0)) }
let local = replicaPool[0]
let namePool = ["shiftTypes", "locations", "title", "duration", "", "x", "ü", String(repeating: "n", count: 300)]

func replica(_ c: inout Choices) -> ReplicaID {
    c.chance(oneIn: 16) ? ReplicaID(high: c.u64(), low: c.u64()) : c.pick(replicaPool)
}

func name(_ c: inout Choices) -> String {
    c.rare(oneIn: 32) ? String(repeating: "s", count: c.pick([0, 1, 255, 65_536])) : c.pick(namePool)
}

func value(_ c: inout Choices, depth: Int = 0) -> FieldValue {
    if depth == 0 && c.rare(oneIn: 24) {
        // A chain of lists 63, 64 or 65 deep (the decoders accept 63 levels below the top).
        var v = FieldValue.int(1)
        for _ in 0..<c.pick([62, 63, 64, 65]) { v = .list([v]) }
        return v
    }
    switch c.below(depth > 3 ? 7 : 9) {
    case 0: return .null
    case 1: return .bool(c.chance(oneIn: 2))
    case 2: return .int(Int64(bitPattern: c.u64()))
    case 3: return .double(c.pick([.nan, .infinity, -.infinity, 1e300, 0, -0.0, 28_800, Double(bitPattern: c.u64())]))
    case 4: return .string(name(&c))
    case 5: return .bytes([UInt8](repeating: c.byte(), count: c.pick([0, 1, 16, 4_096])))  // index 0 when exhausted
    case 6: return .uuid(UUID(uuid: (c.byte(), 0, 0, 0, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, c.byte())))
    case 7: return .list((0..<c.below(4)).map { _ in value(&c, depth: depth + 1) })
    default:
        var map: [String: FieldValue] = [:]
        for _ in 0..<c.below(4) { map[name(&c)] = value(&c, depth: depth + 1) }
        return .map(map)
    }
}

/// A context of up to a few replicas with boundary counters. (Contexts *at* the replica and
/// cloud limits are accepted by the unit tests; building one here would cost seconds per
/// input under ASan. Contexts *past* them are sent as raw bytes: see `overLimitContext`.)
func context(_ c: inout Choices) -> CausalContext {
    var context = CausalContext()
    for _ in 0..<c.below(6) {
        let r = replica(&c)
        if c.chance(oneIn: 2) {
            context.merge(CausalContext(versionVector: [r: c.counter()]))
        } else {
            context.insert(Dot(replica: r, counter: c.counter()))
        }
    }
    return context
}

func register(_ c: inout Choices) -> FieldRegister {
    let timestamp = c.timestamp()
    // Encoders require supersedes < timestamp (every builder of registers keeps it).
    let supersedes = timestamp.rawValue > 0 && c.chance(oneIn: 2)
        ? HLCTimestamp(rawValue: timestamp.rawValue - 1 - (c.u64() % timestamp.rawValue))
        : .zero
    return FieldRegister(value: value(&c), timestamp: timestamp, dot: Dot(replica: replica(&c), counter: c.counter()),
                         supersedes: supersedes)
}

func record(_ c: inout Choices) -> RecordState {
    var fields: SortedMap<String, FieldRegister> = [:]
    for _ in 0..<c.below(4) { fields[name(&c)] = register(&c) }
    var presence: SortedMap<ReplicaID, PresenceEntry> = [:]
    for _ in 0..<c.below(3) {
        presence[replica(&c)] = PresenceEntry(counter: c.counter(),
                                              removedBy: c.chance(oneIn: 3) ? Dot(replica: replica(&c), counter: c.counter()) : nil)
    }
    if fields.isEmpty && presence.isEmpty { presence[local] = PresenceEntry(counter: c.counter(), removedBy: nil) }
    return RecordState(fields: fields, presence: presence)
}

func key(_ c: inout Choices) -> RecordKey {
    RecordKey(collection: c.pick(["shiftTypes", "locations", "settings"]), id: UUID(uuid: (0, 0, 0, 0, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, c.byte() % 8)))
}

/// A general delta, or one shaped like a single local write (encoded in the event form).
func delta(_ c: inout Choices) -> RecordMap {
    if c.chance(oneIn: 2) {
        let dot = Dot(replica: replica(&c), counter: c.counter())
        var fields: SortedMap<String, FieldRegister> = [:]
        for _ in 0..<c.below(4) {
            let r = register(&c)
            fields[name(&c)] = FieldRegister(value: r.value, timestamp: r.timestamp, dot: dot, supersedes: r.supersedes)
        }
        let state = RecordState(fields: fields, presence: [dot.replica: PresenceEntry(counter: dot.counter, removedBy: nil)])
        return RecordMap(records: [(key(&c), state)], context: CausalContext(dots: [dot]), maintainingDigest: false)
    }
    var records: [RecordKey: RecordState] = [:]
    for _ in 0..<c.below(5) { records[key(&c)] = record(&c) }
    return RecordMap(records: records.map { ($0.key, $0.value) }, context: context(&c), maintainingDigest: false)
}

/// The entries of a context (§5.2) past a limit, written byte by byte with `writeReplica` (a
/// blob's table index or a session reference), so the decoders' refusal is exercised at its
/// real size: one replica past 10,000, one cloud counter past 100,000 (spread over a few
/// replicas), or 100,000 replicas.
/// Over-limit shapes: (replicas, cloud counters of the last replica). Each is refused at a
/// count, before its entries are built: one replica past 10,000; 100,000 replicas; one cloud
/// past 100,000 dots; and the cloud limit reached over two replicas (one dot, then 100,000).
let overLimitShapes = [(ValidationLimits.maxContextReplicas + 1, 0), (100_000, 0), (1, ValidationLimits.maxCloudDots + 1),
                       (2, ValidationLimits.maxCloudDots)]

func overLimitContext(_ shape: (replicas: Int, cloud: Int), writeReplica: (Int, inout [UInt8]) -> Void) -> [UInt8] {
    var out: [UInt8] = []
    Varint.append(UInt64(shape.replicas), to: &out)
    for i in 0..<shape.replicas {
        let cloud = i == shape.replicas - 1 ? shape.cloud : (shape.cloud > 0 ? 1 : 0)
        writeReplica(i, &out)
        Varint.append(UInt64(i % 3 + 1), to: &out)
        Varint.append(UInt64(cloud), to: &out)
        out.append(contentsOf: repeatElement(2, count: cloud))
    }
    return out
}

func replicaBytes(_ high: UInt64, _ low: Int) -> [UInt8] {
    (0..<8).map { UInt8(truncatingIfNeeded: high >> (56 - 8 * UInt64($0))) } + (0..<8).map { UInt8(truncatingIfNeeded: UInt64(low) >> (56 - 8 * UInt64($0))) }
}

/// Built once: each takes a while to write out byte by byte under ASan, and decoders must
/// refuse them after reading a few bytes, so using them costs little.
let overLimitBlobs: [[UInt8]] = overLimitShapes.map { shape in
    var blob: [UInt8] = []
    Varint.append(UInt64(shape.0), to: &blob)
    for i in 0..<shape.0 { blob += replicaBytes(0xC0, i) }
    return blob + overLimitContext(shape) { i, out in Varint.append(UInt64(i), to: &out) }
}

/// General deltas (§5.2) whose contexts define their replicas as they go.
let overLimitDeltas: [[UInt8]] = overLimitShapes.map { shape in
    [0] + overLimitContext(shape) { i, out in
        out.append(0)
        out += replicaBytes(0xC1, i)
    } + [0]  // no collections
}

// MARK: - The existing state

/// A replica holding a few records written by three replicas, its own among them.
let existing: RecordMap = {
    var map = RecordMap()
    var clock = HybridLogicalClock(physicalClock: { 1_700_000_000_000 })
    for i in 0..<12 {
        let key = RecordKey(collection: i % 2 == 0 ? "shiftTypes" : "locations",
                            id: UUID(uuid: (0, 0, 0, 0, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, UInt8(i % 8))))
        _ = try? map.write(["title": .string("t\(i)"), "duration": .int(Int64(i))], to: key, at: clock.tick(), by: replicaPool[i % 3])
    }
    return map
}()

// MARK: - Oracles

func check(_ condition: Bool, _ message: @autoclosure () -> String) {
    if !condition { fatalError("structured fuzz: \(message())") }
}

/// Everything a node and a store do with a decoded delta.
func exercise(_ delta: RecordMap) {
    check(delta.limitViolation == nil, "a decoded delta breaks a limit: \(delta.limitViolation ?? "")")
    // The journal keeps decoded deltas; it must read back what it wrote.
    let journaled = try? RecordMap(decoding: delta.encoded())
    check(journaled == delta, "a decoded delta does not round-trip through the journal encoding")
    var state = existing
    let outcome = state.apply(delta)
    check(state.merged(with: delta) == state, "join is not idempotent")
    check(state.digest == RecordMap(records: state.allRecords, context: state.context).digest, "maintained digest differs")
    _ = delta.digest
    exercise(delta.context)
    // The receiver's clock observes the delta; its next ticks must not trap and stay valid.
    var clock = HybridLogicalClock(latest: state.maxTimestamp, physicalClock: { 1_700_000_000_000 })
    clock.observe(outcome.maxTimestamp)
    let tick = clock.tick()
    check(ValidationLimits.isValidTimestamp(tick), "clock issued \(tick) past the limit")
    // A local write after the join succeeds or fails cleanly (counter exhausted).
    do {
        let written = try state.write(["title": "after"], to: RecordKey(collection: "shiftTypes", id: UUID()), at: tick, by: local)
        check(written.limitViolation == nil, "a local write made an invalid delta: \(written.limitViolation ?? "")")
    } catch {
        check(state.context.maxCounter(of: local) >= ValidationLimits.maxCounter, "write refused below the counter limit")
    }
    _ = try? state.remove(RecordKey(collection: "locations", id: UUID(uuid: (0, 0, 0, 0, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, 0, 1))), by: local)
}

func exercise(_ context: CausalContext) {
    check(context.limitViolation == nil, "a decoded context breaks a limit: \(context.limitViolation ?? "")")
    var merged = existing.context
    merged.merge(context)
    check(merged.includes(context) && merged.includes(existing.context), "a union does not include its parts")
    _ = context.includes(existing.context)
    _ = context.causalRelation(to: merged)
    check(merged.merged(with: context) == merged, "context join is not idempotent")
    check((try? CausalContext(blob: context.encodedBlob())) == context, "a decoded context does not round-trip")
    _ = RecordMap.contextDigestProbe(context)
    _ = try? context.nextDot(for: local)
}

extension RecordMap {
    /// The digest of a state that is only this context (what a hello's receiver compares).
    static func contextDigestProbe(_ context: CausalContext) -> StateDigest {
        RecordMap(records: [(RecordKey, RecordState)](), context: context).digest
    }
}

/// The store's blob decoders accept a value iff it is within the limits.
func checkBlobs(_ built: RecordMap) {
    let journal = Result { () throws(BinaryDecodingError) -> RecordMap in try RecordMap(decoding: built.encoded()) }
    switch journal {
    case .success(let decoded): check(built.limitViolation == nil && decoded == built, "journal blob: accepted an invalid or changed delta")
    case .failure(let error): check(built.limitViolation != nil, "journal blob: refused a valid delta (\(error))")
    }
    let contextBlob = Result { () throws(BinaryDecodingError) -> CausalContext in try CausalContext(blob: built.context.encodedBlob()) }
    switch contextBlob {
    case .success(let decoded): check(built.context.limitViolation == nil && decoded == built.context, "context blob: accepted an invalid context")
    case .failure(let error): check(built.context.limitViolation != nil, "context blob: refused a valid context (\(error))")
    }
    for (_, state) in built.allRecords.prefix(2) {
        let decoded = try? RecordState(blob: state.encodedBlob())
        check((decoded != nil) == (state.limitViolation == nil), "record blob: accepted an invalid or refused a valid record")
        if let decoded { check(decoded == state, "record blob changed the record") }
    }
}

// MARK: - Entry point

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzStructured(_ data: UnsafeRawPointer, _ size: Int) -> CInt {
    var c = Choices(Array(UnsafeRawBufferPointer(start: data, count: size)))
    var session = Session()
    for _ in 0..<(1 + c.below(4)) {
        var built: RecordMap?
        let message: Message
        switch c.below(8) {
        case 0:
            message = .hello(Hello(replicaID: replica(&c), name: name(&c), wallClockMilliseconds: Session.start,
                                   context: context(&c), digest: StateDigest(high: c.u64(), low: c.u64())))
        case 1:
            let count = c.rare(oneIn: 8) ? c.pick([4_096, 4_097]) : c.below(3)
            let neighbors = c.chance(oneIn: 2) ? nil : Array(manyNeighbors.prefix(count))
            message = .ack(context(&c), neighbors: neighbors, incremental: c.chance(oneIn: 2))
        case 2, 3:
            let delta = delta(&c)
            checkBlobs(delta)
            let records = c.chance(oneIn: 2) ? UInt64(delta.recordCount) : c.count()
            message = .chunk(index: c.count(), count: c.count(), records: records, delta: WireDelta.encode(delta, with: session.sender))
            built = delta
        case 4, 5, 6:
            let delta = delta(&c)
            checkBlobs(delta)
            message = .delta(WireDelta.encode(delta, with: session.sender))
            built = delta
        case 7 where c.rare(oneIn: 8):
            session.receiveOverLimit(&c)
            continue
        default:
            message = c.pick([.ping(c.u64()), .digest(StateDigest(high: 1, low: 2), records: c.count()), .goodbye(.normal, name(&c))])
        }
        if !session.receive(message, built: built) {
            session = Session()  // the session closes on a refused frame; the next starts afresh
        }
    }
    return 0
}

/// One direction of a session: what the sender's encoders and the receiver's decoders share.
struct Session {
    static let start: UInt64 = 1_700_000_000_000
    var sender = WireDictionary(startingAt: start)
    var receiver = WireDictionary(startingAt: start)
    var splitter = FrameSplitter(maxFrameBytes: WireLimits.defaultMaxFrameBytes)

    /// Sends a hello, an ack or a delta whose context is past a limit, as raw bytes: every
    /// decoder must refuse it (without building it: that is what keeps this fast).
    mutating func receiveOverLimit(_ c: inout Choices) {
        defer { self = Session() }
        switch c.below(3) {
        case 0, 1:
            // A valid hello or ack, then field 5 / 1 again with the over-limit blob (the last
            // value of a repeated field wins).
            let frame = (c.chance(oneIn: 2)
                ? Message.hello(Hello(replicaID: local, name: "x", wallClockMilliseconds: Session.start, context: CausalContext(), digest: .empty))
                : Message.ack(CausalContext(), neighbors: nil)).encodedFrame()
            var splitter = FrameSplitter(maxFrameBytes: WireLimits.defaultMaxFrameBytes)
            splitter.append(frame)
            guard let (type, body) = try? splitter.next() else { fatalError("structured fuzz: a small frame was refused") }
            let blob = c.pick(overLimitBlobs)
            var field: [UInt8] = []
            Varint.append((type == Message.Kind.hello.rawValue ? 5 : 1) << 3 | 2, to: &field)
            Varint.append(UInt64(blob.count), to: &field)
            check((try? Message.decode(type: type, body: body + field + blob)) == nil, "an over-limit context in a hello or ack decoded")
            check((try? CausalContext(blob: blob)) == nil, "an over-limit context blob decoded")
        default:
            check((try? WireDelta.decode(c.pick(overLimitDeltas), with: receiver)) == nil, "an over-limit context in a delta decoded")
        }
    }

    /// Sends `message` (built from `built`, if a delta) through frames and every decoder, as a
    /// node receives it. Returns false if the frame was refused.
    mutating func receive(_ message: Message, built: RecordMap?) -> Bool {
        splitter.append(message.encodedFrame())
        guard let frame = try? splitter.next() else { return false }  // over the frame limit
        let decoded: Message
        do {
            decoded = try Message.decode(type: frame.type, body: frame.body)
        } catch {
            switch message {
            case .hello(let h): check(h.context.limitViolation != nil, "hello: refused a valid context (\(error))")
            case .ack(let context, let neighbors, _):
                check(context.limitViolation != nil || (neighbors?.count ?? 0) > 4_096, "ack: refused a valid one (\(error))")
            case .chunk(let index, let count, let records, let body, _):
                check(!(index < count && count <= WireLimits.maxChunksPerRound && records <= UInt64(body.count)),
                      "chunk: refused a valid header (\(error))")
            default: check(false, "refused \(message.kind): \(error)")
            }
            return false
        }
        let payload: [UInt8]
        switch decoded {
        case .hello(let hello):
            guard case .hello(let original) = message else { fatalError("structured fuzz: message kind changed") }
            check(original.context.limitViolation == nil && hello == original, "hello: accepted an invalid context, or changed")
            exercise(hello.context)
            return true
        case .ack(let context, let neighbors, _):
            check(context.limitViolation == nil, "ack: accepted an invalid context")
            check((neighbors?.count ?? 0) <= 4_096, "ack: too many neighbours")
            exercise(context)
            return true
        case .chunk(let index, let count, let records, let body, _):
            check(index < count && count <= WireLimits.maxChunksPerRound && records <= UInt64(body.count), "chunk header out of bounds")
            _ = (Int(index) + 1, Int(count), Int(records))  // the session layer's conversions
            payload = body
        case .delta(let body):
            payload = body
        default:
            return true
        }
        do {
            let delta = try WireDelta.decode(payload, with: receiver)
            if let built { check(built.limitViolation == nil && delta == built, "wire: accepted an invalid delta, or changed it") }
            exercise(delta)
            return true
        } catch {
            if let built, built.limitViolation == nil, case .malformed = error {
                fatalError("structured fuzz: wire refused a valid delta: \(error)")
            }
            return false
        }
    }
}
