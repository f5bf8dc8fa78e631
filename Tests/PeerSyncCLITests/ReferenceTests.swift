import Foundation
import PeerSyncTestSupport
import Testing

/// References through the command: a shift type's location that was removed reads as none, and
/// editing the shift type must not write that "none" back (issue 29, item 4).
@Suite("peersync and references", .ownThread)
struct CLIReferenceTests {
    func output(_ store: String, _ arguments: [String]) throws -> String {
        let result = try cli(in: store, arguments)
        #expect(result.status == 0, "\(arguments): \(result.stderr)")
        return result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    func json(_ store: String, _ arguments: [String]) throws -> Any {
        try JSONSerialization.jsonObject(with: Data(output(store, arguments).utf8))
    }

    /// Carries to `to` what it lacks from `from`, through bundle files.
    func carry(from: String, to: String, via files: String, _ name: String) throws {
        _ = try output(to, ["bundle", "context", "-o", "\(files)/\(name).psc"])
        _ = try output(from, ["bundle", "create", "--for", "\(files)/\(name).psc", "-o", "\(files)/\(name).psb"])
        _ = try output(to, ["bundle", "apply", "\(files)/\(name).psb"])
    }

    @Test("editing a shift type whose location was removed writes only the edited field; a concurrent rename brings the location back and the shift type points at it on both devices")
    func editAfterTheLocationWasRemoved() throws {
        let (a, b, files) = try (makeTemporaryDirectory("ref-a"), makeTemporaryDirectory("ref-b"), makeTemporaryDirectory("ref-files"))
        defer { [a, b, files].forEach(removeTemporaryDirectory) }
        _ = try output(a, ["init", "--name", "office"])
        _ = try output(b, ["init", "--name", "laptop", "--join", try output(a, ["invite"])])
        let location = try output(a, ["location", "add", "--name", "W"])
        let shift = try output(a, ["shift-type", "add", "--symbol", "E", "--title", "Early", "--duration", "8h", "--location", location])
        try carry(from: a, to: b, via: files, "1")

        // Apart: a removes the location, then edits the shift type; b renames the location.
        _ = try output(a, ["location", "rm", location])
        _ = try output(a, ["shift-type", "set", shift, "--title", "X"])
        let log = try #require(try json(a, ["log", "--json", "--limit", "1"]) as? [[String: Any]])
        let changes = try #require(log.first?["changes"] as? [[String: Any]], "\(log)")
        #expect(changes.count == 1)
        #expect(changes.first?["fields"] as? [String] == ["title"], "\(changes)")
        _ = try output(b, ["location", "set", location, "--name", "W North"])

        try carry(from: a, to: b, via: files, "2")
        try carry(from: b, to: a, via: files, "3")
        for store in [a, b] {
            let shown = try #require(try json(store, ["shift-type", "show", shift, "--json"]) as? [String: Any])
            #expect(shown["locationID"] as? String == location, "\(store): \(shown)")
            #expect(shown["title"] as? String == "X")
            let place = try #require(try json(store, ["location", "show", location, "--json"]) as? [String: Any])
            #expect(place["name"] as? String == "W North")
        }
        #expect(try status(a).digest == status(b).digest)

        // An explicit --location none detaches, also from a removed location.
        _ = try output(a, ["location", "rm", location])
        _ = try output(a, ["shift-type", "set", shift, "--location", "none"])
        let detach = try #require(try json(a, ["log", "--json", "--limit", "1"]) as? [[String: Any]])
        #expect((detach.first?["changes"] as? [[String: Any]])?.first?["fields"] as? [String] == ["locationID"], "\(detach)")
    }
}
