import Foundation
import PeerSyncTestSupport
import Testing

/// Sync through files with `peersync bundle`: a context file from the device that lacks data, a
/// bundle of exactly what it lacks, applied on it.
@Suite("peersync bundle", .ownThread)
struct BundleTests {
    func invite(_ store: String) throws -> String {
        try cli(in: store, ["invite"]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    @Test("two replicas converge through bundles carried as files; tampered and foreign bundles are refused and change nothing")
    func bundles() throws {
        let (a, b, stranger, files) = try (makeTemporaryDirectory("bundle-a"), makeTemporaryDirectory("bundle-b"),
                                           makeTemporaryDirectory("bundle-x"), makeTemporaryDirectory("bundle-files"))
        defer { [a, b, stranger, files].forEach(removeTemporaryDirectory) }
        try #require(try cli(in: a, ["init", "--name", "office"]).status == 0)
        try #require(try cli(in: b, ["init", "--name", "laptop", "--join", invite(a)]).status == 0)
        try #require(try cli(in: stranger, ["init", "--name", "stranger"]).status == 0)
        for i in 0..<20 { try cli(in: a, ["location", "add", "--name", "Ward \(i)"]) }
        try cli(in: b, ["shift-type", "add", "--symbol", "N", "--title", "Night", "--duration", "10h"])

        // b (still joining: it never met its inviter) lacks a's data: its context goes to a, the
        // bundle comes back — which also completes b's join.
        #expect(try cli(in: b, ["bundle", "context", "-o", "\(files)/b.psc"]).status == 0)
        let create = try cli(in: a, ["bundle", "create", "--for", "\(files)/b.psc", "-o", "\(files)/to-b.psb"])
        #expect(create.status == 0, "\(create.stderr)")
        #expect(create.stdout.contains("records"), "\(create.stdout)")
        // Before its join completes, b knows no member's key: --all has nobody to encrypt for.
        let early = try cli(in: b, ["bundle", "create", "--all", "-o", "\(files)/early.psb"])
        #expect(early.status != 0 && early.stderr.contains("not joined"), "\(early.stderr)")

        // Tampered: one byte flipped in the ciphertext → refused, nothing changes.
        var bytes = try #require(FileManager.default.contents(atPath: "\(files)/to-b.psb"))
        bytes[bytes.count - 20] ^= 0x01
        #expect(FileManager.default.createFile(atPath: "\(files)/tampered.psb", contents: bytes))
        let before = try status(b).digest
        let tampered = try cli(in: b, ["bundle", "apply", "\(files)/tampered.psb"])
        #expect(tampered.status != 0)
        #expect(tampered.stderr.contains("changed after it was made"), "\(tampered.stderr)")
        #expect(tampered.stderr.contains("nothing was applied"))
        // From another group → refused, nothing changes.
        #expect(try cli(in: stranger, ["bundle", "create", "--all", "-o", "\(files)/foreign.psb"]).status == 0)
        let foreign = try cli(in: b, ["bundle", "apply", "\(files)/foreign.psb"])
        #expect(foreign.status != 0)
        #expect(foreign.stderr.contains("another sync group"), "\(foreign.stderr)")
        // Not a bundle at all.
        #expect(FileManager.default.createFile(atPath: "\(files)/junk.psb", contents: Data("hello".utf8)))
        #expect(try cli(in: b, ["bundle", "apply", "\(files)/junk.psb"]).stderr.contains("not a PeerSync sync bundle"))
        #expect(try status(b).digest == before)

        // The real ones: b applies a's (and joins), then sends everything back; both converge, and
        // applying again changes nothing.
        #expect(try cli(in: b, ["bundle", "apply", "\(files)/to-b.psb"]).status == 0)
        #expect(try status(b).role == "member")
        #expect(try cli(in: b, ["bundle", "create", "--all", "-o", "\(files)/to-a.psb"]).status == 0)
        #expect(try cli(in: a, ["bundle", "apply", "\(files)/to-a.psb"]).status == 0)
        #expect(try status(a).digest == status(b).digest)
        #expect(try status(b).records["locations"] == 20)
        #expect(try status(a).records["shiftTypes"] == 1)
        let again = try cli(in: b, ["bundle", "apply", "\(files)/to-b.psb"])
        #expect(again.stdout.contains("0 records changed"), "\(again.stdout)")
    }
}
