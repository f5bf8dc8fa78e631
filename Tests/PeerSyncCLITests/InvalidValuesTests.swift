import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel
import PeerSyncStore
import PeerSyncTestSupport
import Testing
import ShiftSchedulerModel

/// Values no command should compute with: a shift type's stored duration that is NaN, infinite
/// or absurd (written by another program, or synced from a peer that did not check).
@Suite("peersync and invalid stored values", .ownThread)
struct InvalidValuesTests {
    @Test("shift-type list/show and --json show invalid durations instead of crashing")
    func invalidDurations() throws {
        let store = try makeTemporaryDirectory("peersync-invalid")
        defer { removeTemporaryDirectory(store) }
        try #require(try cli(in: store, ["init", "--name", "a"]).status == 0)
        let cases: [(FieldValue, String)] = [(.double(.nan), "nan"), (.double(.infinity), "inf"), (.double(-.infinity), "-inf"),
                                             (.double(1e300), "1e+300"), (.double(-5), "-5.0"), (.int(Int64.max), "9.223372036854776e+18")]
        var ids: [UUID: String] = [:]
        let replica = try ReplicaStore.open(directory: store)
        for (index, (value, text)) in cases.enumerated() {
            let id = UUID()
            ids[id] = text
            try replica.write { state in
                state.write(["symbol": .string("S\(index)"), "title": "Broken", "description": "", "duration": value, "locationID": .null],
                            to: RecordKey(collection: ShiftType.collection, id: id))
            }
        }
        try #require(try cli(in: store, ["shift-type", "add", "--symbol", "E", "--title", "Early", "--duration", "8h"]).status == 0)

        let list = try cli(in: store, ["shift-type", "list"])
        #expect(list.status == 0, "\(list.stderr)")
        for text in ids.values { #expect(list.stdout.contains("invalid duration (\(text))"), "\(text): \(list.stdout)") }
        #expect(list.stdout.contains("  8h"))

        let json = try cli(in: store, ["shift-type", "list", "--json"])
        #expect(json.status == 0, "\(json.stderr)")
        let entries = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [[String: Any]])
        #expect(entries.count == cases.count + 1)
        for entry in entries {
            guard let id = (entry["id"] as? String).flatMap(UUID.init(uuidString:)), let text = ids[id] else {
                #expect(entry["durationSeconds"] as? Double == 28_800 && entry["invalidDuration"] == nil)
                continue
            }
            #expect(entry["durationSeconds"] is NSNull, "\(entry)")
            #expect(entry["invalidDuration"] as? String == text, "\(entry)")
        }

        for (id, text) in ids {
            let show = try cli(in: store, ["shift-type", "show", id.uuidString])
            #expect(show.status == 0 && show.stdout.contains("duration:    invalid duration (\(text))"), "\(show.stdout)\(show.stderr)")
            let showJSON = try cli(in: store, ["shift-type", "show", id.uuidString, "--json"])
            #expect(showJSON.status == 0 && showJSON.stdout.contains(#""invalidDuration" : "\#(text)""#), "\(showJSON.stdout)\(showJSON.stderr)")
        }
        // Export and conflicts keep working; non-finite numbers come out as strings.
        let export = try cli(in: store, ["export"])
        #expect(export.status == 0 && export.stdout.contains(#""duration" : "NaN""#), "\(export.stderr)")
    }

    @Test("import and --duration refuse invalid durations with one line naming the file, entry and field")
    func refusedAtTheDoor() throws {
        let store = try makeTemporaryDirectory("peersync-invalid")
        defer { removeTemporaryDirectory(store) }
        try #require(try cli(in: store, ["init", "--name", "a"]).status == 0)
        let before = try status(store).digest
        let file = store + "/shifts.json"
        try Data(#"[{"id": "6A1C3B8E-0C47-4F59-9E8B-1D2A3C4B5E6F", "symbol": "E", "duration": 1e300}]"#.utf8)
            .write(to: URL(fileURLWithPath: file))
        let imported = try cli(in: store, ["import", file])
        #expect(imported.status != 0)
        #expect(imported.stderr.contains("shifts.json: entry 0.duration 1e+300 is not a valid duration"), "\(imported.stderr)")
        #expect(imported.stderr.trimmingCharacters(in: .whitespacesAndNewlines).split(separator: "\n").count == 1)
        for duration in ["inf", "1e300", "-5", "NaN", "999999999999999999999999h", "P400D"] {
            let added = try cli(in: store, ["shift-type", "add", "--symbol", "E", "--title", "Early", "--duration=\(duration)"])
            #expect(added.status != 0 && added.stderr.contains("invalid duration"), "\(duration): \(added.stderr)")
        }
        #expect(try status(store).digest == before)
    }
}
