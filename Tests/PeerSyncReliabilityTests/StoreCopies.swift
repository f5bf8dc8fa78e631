import Foundation
import Logging
import PeerSync
import PeerSyncTestSupport
import Testing
import ShiftSchedulerModel

/// Devices of one group whose stores a test backs up and puts back (restores and copies,
/// issues 17 and 29): created on first use, opened afterwards; synced over TLS on 127.0.0.1.
struct StoreCopies {
    let group: LocalGroup
    static let files = ["replica.sqlite", "replica.sqlite-wal", "device-key.pem"]

    init(names: [String]) {
        group = try! LocalGroup.make(names: names)
    }

    /// Device `name` of the group: created on first use, opened afterwards.
    func open(_ directory: String, _ name: String, _ lines: RecordingLogHandler.Lines = .init()) throws -> Replica {
        let logger = RecordingLogHandler.logger(name, into: lines)
        if FileManager.default.fileExists(atPath: ReplicaStore.path(in: directory)) {
            return try Replica.open(at: directory, logger: logger)
        }
        return try Replica.create(at: directory, member: group.names.firstIndex(of: name) ?? 0, of: group, logger: logger)
    }

    func sync(_ replica: Replica, peers: [UInt16] = []) async throws -> UInt16 {
        try await replica.startSync(SyncConfiguration(security: .tls, listen: .loopback(0), peers: peers.map { .loopback($0) }))
    }

    func names(_ replica: Replica) throws -> [String] { try replica.fetchAll(Location.self).map(\.name).sorted() }

    /// Copies the store's files (the node is stopped and the store closed, as a backup tool would).
    func backup(_ directory: String, to copy: String) throws {
        try FileManager.default.createDirectory(atPath: copy, withIntermediateDirectories: true)
        for file in Self.files where FileManager.default.fileExists(atPath: "\(directory)/\(file)") {
            try FileManager.default.copyItem(atPath: "\(directory)/\(file)", toPath: "\(copy)/\(file)")
        }
    }

    /// Puts a backup back: as new files, or written over the existing files in place (same
    /// inode: the store cannot tell from its file, only peers can).
    func restore(_ copy: String, to directory: String, inPlace: Bool) throws {
        try? FileManager.default.removeItem(atPath: "\(directory)/replica.sqlite-shm")
        for file in Self.files where file != "device-key.pem" {
            let target = "\(directory)/\(file)"
            guard let bytes = FileManager.default.contents(atPath: "\(copy)/\(file)") else {
                try? FileManager.default.removeItem(atPath: target)
                continue
            }
            if inPlace, FileManager.default.fileExists(atPath: target) {
                let handle = try #require(FileHandle(forUpdatingAtPath: target))
                try handle.truncate(atOffset: 0)
                try handle.write(contentsOf: bytes)
                try handle.close()
            } else {
                try? FileManager.default.removeItem(atPath: target)
                #expect(FileManager.default.createFile(atPath: target, contents: bytes))
            }
        }
    }

    /// Stops `replica` and lets it go, waiting (bounded) until its store is closed — nothing
    /// (a compaction step, a checkpoint pass) writes to the files after this returns.
    func close(_ replica: inout Replica?) async {
        await replica?.stopSync()
        weak let store = replica?.store
        replica = nil
        #expect(await eventually(timeout: .seconds(10)) { store == nil }, "the store was not released")
    }
}
