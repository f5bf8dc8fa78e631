import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import PeerSyncStore
import PeerSyncTestSupport
import Testing
import ShiftSchedulerModel

@Suite("Import and export")
struct DataExchangeTests {
    let shiftTypesJSON = """
        [
          {"id": "6A1C3B8E-0C47-4F59-9E8B-1D2A3C4B5E6F", "symbol": "E", "title": "Early", "description": "6–14",
           "duration": 28800, "location": {"id": "0F0E0D0C-0B0A-4909-8807-060504030201", "name": "Ward 3", "address": "Main St 1"}},
          {"id": "7B2D4C9F-1D58-4A6A-8F9C-2E3B4D5C6F70", "symbol": "N", "title": "Night", "description": "",
           "duration": "PT10H30M", "location": null}
        ]
        """
    let locationsJSON = """
        [{"id": "0F0E0D0C-0B0A-4909-8807-060504030201", "name": "Ward 3", "address": "Main St 1"},
         {"id": "11111111-2222-4333-8444-555555555555", "name": "Depot", "address": "Quay 4"}]
        """

    func importing(_ json: String, into store: ReplicaStore) throws -> DataExchange.ImportSummary {
        var summary = DataExchange.ImportSummary()
        try store.write { state in
            let (delta, s) = try DataExchange.importData(Data(json.utf8), into: &state)
            summary = s
            return delta
        }
        return summary
    }

    @Test("ShiftScheduler files import with IDs kept; twice is a no-op")
    func shiftSchedulerIdempotent() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        let store = try ReplicaStore.create(directory: dir, name: "x")
        let first = try importing(shiftTypesJSON, into: store)
        #expect(first.created == 3)
        let second = try importing(shiftTypesJSON, into: store)
        #expect(second == DataExchange.ImportSummary(created: 0, updated: 0, unchanged: 3))
        let third = try importing(locationsJSON, into: store)
        #expect(third.created == 1 && third.unchanged == 1)
        let state = store.state
        let early = try #require(try state.fetch(ShiftType.self, id: UUID(uuidString: "6A1C3B8E-0C47-4F59-9E8B-1D2A3C4B5E6F")!))
        #expect(early.duration == 28_800)
        #expect(early.locationID == UUID(uuidString: "0F0E0D0C-0B0A-4909-8807-060504030201"))
        #expect(try state.fetch(Location.self, id: early.locationID!)?.name == "Ward 3")
        let night = try #require(try state.fetch(ShiftType.self, id: UUID(uuidString: "7B2D4C9F-1D58-4A6A-8F9C-2E3B4D5C6F70")!))
        #expect(night.duration == 37_800 && night.locationID == nil)
        #expect(try state.fetchAll(Location.self).count == 2)
    }

    @Test("export → import into a fresh replica gives the same visible data")
    func exportImportRoundTrip() throws {
        let a = try makeTemporaryDirectory()
        let b = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(a); removeTemporaryDirectory(b) }
        let source = try ReplicaStore.create(directory: a, name: "source")
        _ = try importing(shiftTypesJSON, into: source)
        try source.write { state in
            let d1 = state.setSetting(SettingKey.weekStart, to: 1, scope: .synced)
            let d2 = try state.save(Location(name: "Gone"))
            let d3 = state.delete(Location.self, id: try state.fetchAll(Location.self).first { $0.name == "Gone" }!.id)
            _ = state.setSetting(SettingKey.powerMode, to: "low", scope: .local)
            return [d1, d2, d3].compactMap { $0 }.reduce(RecordMap()) { $0.merged(with: $1) }
        }
        let exported = try DataExchange.exportData(source.state)
        let target = try ReplicaStore.create(directory: b, name: "target")
        _ = try importing(String(decoding: exported, as: UTF8.self), into: target)
        #expect(try DataExchange.exportData(target.state) == exported)
        #expect(Set(try target.state.fetchAll(ShiftType.self)) == Set(try source.state.fetchAll(ShiftType.self)))
        #expect(target.state.setting(SettingKey.powerMode, scope: .local) == nil)
        #expect(!String(decoding: exported, as: UTF8.self).contains("Gone"))
        // And importing the export back into its source changes nothing.
        #expect(try importing(String(decoding: exported, as: UTF8.self), into: source).created == 0)
        #expect(try importing(String(decoding: exported, as: UTF8.self), into: source).updated == 0)
    }

    @Test("bad files are refused whole, naming the entry")
    func badFiles() throws {
        let dir = try makeTemporaryDirectory()
        defer { removeTemporaryDirectory(dir) }
        let store = try ReplicaStore.create(directory: dir, name: "x")
        let digest = store.state.digest
        let cases: [(String, String)] = [
            ("{not json", "not valid JSON"),
            (#"[{"id": "6A1C3B8E-0C47-4F59-9E8B-1D2A3C4B5E6F", "symbol": "E", "duration": "8 hours"}]"#, "entry 0.duration"),
            (#"[{"id": "nope", "name": "x"}]"#, "entry 0.id"),
            (#"[{"id": "11111111-2222-4333-8444-555555555555", "name": "ok"}, {"name": "no id"}]"#, "entry 1"),
            (#"{"format": "peersync-export", "version": 99}"#, "newer"),
            (#"{"hello": 1}"#, "unknown JSON document"),
        ]
        for (json, expected) in cases {
            #expect(throws: DataExchange.ImportError.self) { _ = try importing(json, into: store) }
            do { _ = try importing(json, into: store) } catch {
                #expect("\(error)".contains(expected), "\(error) should mention \(expected)")
            }
        }
        #expect(store.state.digest == digest)
    }

    @Test("ISO 8601 durations")
    func isoDurations() {
        #expect(ISO8601Duration.seconds("PT8H") == 28_800)
        #expect(ISO8601Duration.seconds("PT7H30M") == 27_000)
        #expect(ISO8601Duration.seconds("P1DT2H") == 93_600)
        #expect(ISO8601Duration.seconds("PT0.5H") == 1_800)
        #expect(ISO8601Duration.seconds("P1W") == 604_800)
        #expect(ISO8601Duration.seconds("P1M") == nil)   // months have no fixed length
        #expect(ISO8601Duration.seconds("PT") == nil)
        #expect(ISO8601Duration.seconds("8H") == nil)
        #expect(ISO8601Duration.seconds("PTH") == nil)
    }
}
