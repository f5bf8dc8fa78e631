@_spi(Engine) @testable import PeerSyncCRDT
import PeerSyncTestSupport
import Testing

@Suite("Sorted map")
struct SortedMapTests {
    /// Keys strictly ascending and the same entries as the dictionary it shadows.
    static func check(_ map: SortedMap<String, Int>, _ model: [String: Int], _ context: String) {
        let keys = Array(map.keys)
        #expect(zip(keys, keys.dropFirst()).allSatisfy { $0 < $1 }, "keys not strictly ascending: \(context)")
        #expect(map.dictionary == model, "\(context)")
        #expect(map.count == model.count, "\(context)")
    }

    @Test("random inserts, replacements and removals behave as a Dictionary's, keys stay ascending (maps of 0–40 entries, both lookup paths)")
    func behavesAsDictionary() {
        var rng = SeededGenerator(seed: baseSeed)
        for round in 0..<200 {
            var map = SortedMap<String, Int>()
            var model: [String: Int] = [:]
            let width = Int.random(in: 1...40, using: &rng)
            for step in 0..<120 {
                let key = "f\(Int.random(in: 0..<width, using: &rng))"
                let context = "round \(round), step \(step), key \(key)"
                switch Int.random(in: 0..<4, using: &rng) {
                case 0:
                    map[key] = step
                    model[key] = step
                case 1:
                    #expect(map.updateValue(step, forKey: key) == model.updateValue(step, forKey: key), "\(context)")
                case 2:
                    #expect(map.removeValue(forKey: key) == model.removeValue(forKey: key), "\(context)")
                default:
                    map[key] = nil
                    model[key] = nil
                }
                #expect(map[key] == model[key], "\(context)")
                let probe = "f\(Int.random(in: 0..<(width + 2), using: &rng))"
                #expect(map[probe] == model[probe], "\(context)")
            }
            Self.check(map, model, "round \(round)")
        }
    }

    @Test("equality and hash ignore the order entries were added in; iteration, keys and values follow key order")
    func orderIndependent() {
        var rng = SeededGenerator(seed: baseSeed &+ 1)
        let pairs = (0..<30).map { ("k\($0)", $0) }
        var first = SortedMap<String, Int>()
        for (key, value) in pairs { first[key] = value }
        var second = SortedMap<String, Int>()
        for (key, value) in pairs.shuffled(using: &rng) { second[key] = value }
        #expect(first == second)
        #expect(first.hashValue == second.hashValue)
        #expect(first == SortedMap(Dictionary(uniqueKeysWithValues: pairs)))
        let sorted = pairs.sorted { $0.0 < $1.0 }
        #expect(first.map(\.key) == sorted.map(\.0))
        #expect(Array(first.values) == sorted.map(\.1))
        #expect(Array(first.keys) == sorted.map(\.0))
        second["k3"] = 99
        #expect(first != second)
    }

    @Test("a literal sorts its entries; mapValues keeps the keys")
    func literalAndMapValues() {
        let map: SortedMap<String, Int> = ["title": 1, "duration": 2, "symbol": 3]
        #expect(Array(map.keys) == ["duration", "symbol", "title"])
        #expect(map.mapValues { $0 * 10 }.dictionary == ["title": 10, "duration": 20, "symbol": 30])
        #expect(map["symbol"] == 3)
        #expect(map["missing"] == nil)
    }
}
