import Crypto
import Foundation
@_spi(Engine) import PeerSyncCRDT
import PeerSyncModel

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Why an attachment could not be stored or read. ``description`` is one line a person can act on.
package enum AttachmentError: Error, Equatable, CustomStringConvertible {
    /// The bytes are over the size bound (the synced setting `attachmentMaxBytes`).
    case tooLarge(bytes: Int64, limit: Int64)
    /// The file to add could not be read.
    case cannotRead(path: String, detail: String)
    /// Writing into the attachment directory failed (disk full, permissions…); nothing was stored.
    case cannotWrite(path: String, detail: String)
    /// A `.partial` write did not continue where the file ends.
    case notContiguous(hash: AttachmentHash, offset: Int64, partialBytes: Int64)

    /// One line that says what happened and what to do.
    public var description: String {
        switch self {
        case .tooLarge(let bytes, let limit):
            "the attachment is \(Self.size(bytes)), over the limit of \(Self.size(limit)); "
                + "raise the synced setting \"attachmentMaxBytes\" or attach a smaller file"
        case .cannotRead(let path, let detail):
            "cannot read \(path): \(detail)"
        case .cannotWrite(let path, let detail):
            "cannot write the attachment into \(path): \(detail); nothing was stored"
        case .notContiguous(let hash, let offset, let partial):
            "attachment \(hash.hex.prefix(12))…: a write at byte \(offset) of a partial file holding \(partial) bytes"
        }
    }

    static func size(_ bytes: Int64) -> String {
        bytes >= 1 << 20 ? String(format: "%.1f MiB", Double(bytes) / 1_048_576) : "\(bytes) bytes"
    }
}

/// Attachment bytes beside a replica's store, content-addressed: `DIR/attachments/<hex sha256>`.
///
/// - Adding writes a temporary file, fsyncs it, renames it to its hash and fsyncs the
///   directory, so a crash leaves either the whole file or none (never a torn one under the
///   final name). The same bytes added twice are stored once.
/// - Incoming transfers write `DIR/attachments/<hex>.partial`; a verified partial file is
///   promoted the same way.
/// - Files are immutable once named; several processes may share the directory.
package final class AttachmentStore: Sendable {
    /// `DIR/attachments`.
    public let directory: String
    private static let chunkBytes = 1 << 20

    /// The attachment directory of the store in `storeDirectory` (created when first written).
    public init(storeDirectory: String) {
        directory = (storeDirectory as NSString).appendingPathComponent("attachments")
    }

    /// The path of the complete bytes of `hash` (which may not exist).
    public func path(for hash: AttachmentHash) -> String {
        (directory as NSString).appendingPathComponent(hash.hex)
    }

    /// The path of the partial file of `hash`.
    public func partialPath(for hash: AttachmentHash) -> String {
        path(for: hash) + ".partial"
    }

    /// Whether the complete bytes of `hash` are here.
    public func contains(_ hash: AttachmentHash) -> Bool {
        FileManager.default.fileExists(atPath: path(for: hash))
    }

    /// Size of the complete file of `hash`, or nil if it is not here.
    public func size(of hash: AttachmentHash) -> Int64? {
        fileSize(path(for: hash))
    }

    /// Size of the `.partial` file of `hash`, or nil if there is none.
    public func partialSize(of hash: AttachmentHash) -> Int64? {
        fileSize(partialPath(for: hash))
    }

    // MARK: - Adding

    /// Stores `data` (unless the same bytes are already here) and returns its attachment.
    public func add(_ data: Data, mediaType: String, maxBytes: Int64) throws(AttachmentError) -> Attachment {
        guard Int64(data.count) <= maxBytes else { throw .tooLarge(bytes: Int64(data.count), limit: maxBytes) }
        let hash = AttachmentHash(bytes: Array(SHA256.hash(data: data)))!
        let attachment = Attachment(contentHash: hash, byteCount: Int64(data.count), mediaType: mediaType)
        if contains(hash) {
            touch(hash)
            return attachment
        }
        try writeAtomically(hash) { handle in try handle.write(contentsOf: data) }
        return attachment
    }

    /// Copies the file at `url` in (unless the same bytes are already here), hashing it as it
    /// streams through in 1 MiB chunks.
    public func add(contentsOf url: URL, mediaType: String, maxBytes: Int64) throws(AttachmentError) -> Attachment {
        let source: FileHandle
        do {
            source = try FileHandle(forReadingFrom: url)
        } catch {
            throw .cannotRead(path: url.path, detail: error.localizedDescription)
        }
        defer { try? source.close() }
        if let size = fileSize(url.path), size > maxBytes { throw .tooLarge(bytes: size, limit: maxBytes) }
        var hasher = SHA256()
        var total: Int64 = 0
        let temporary = try writeTemporary { handle throws(AttachmentError) in
            while true {
                let chunk: Data
                do {
                    chunk = try source.read(upToCount: Self.chunkBytes) ?? Data()
                } catch {
                    throw .cannotRead(path: url.path, detail: error.localizedDescription)
                }
                if chunk.isEmpty { break }
                total += Int64(chunk.count)
                guard total <= maxBytes else { throw .tooLarge(bytes: total, limit: maxBytes) }
                hasher.update(data: chunk)
                do { try handle.write(contentsOf: chunk) } catch {
                    throw .cannotWrite(path: directory, detail: error.localizedDescription)
                }
            }
        }
        let hash = AttachmentHash(bytes: Array(hasher.finalize()))!
        if contains(hash) {
            try? FileManager.default.removeItem(atPath: temporary)  // the same bytes are already stored
            touch(hash)
        } else {
            try promote(temporary, to: path(for: hash))
        }
        return Attachment(contentHash: hash, byteCount: total, mediaType: mediaType)
    }

    // MARK: - Reading

    /// The complete bytes of `hash`, or nil if they are not here (yet).
    public func data(for hash: AttachmentHash) throws(AttachmentError) -> Data? {
        guard contains(hash) else { return nil }
        do {
            return try Data(contentsOf: URL(fileURLWithPath: path(for: hash)))
        } catch {
            if !contains(hash) { return nil }  // purged meanwhile
            throw .cannotRead(path: path(for: hash), detail: error.localizedDescription)
        }
    }

    /// `length` bytes at `offset` of the complete file of `hash` (fewer at its end); nil if
    /// the bytes are not here. For answering a peer's range request.
    public func read(_ hash: AttachmentHash, offset: Int64, length: Int) throws(AttachmentError) -> Data? {
        guard let handle = FileHandle(forReadingAtPath: path(for: hash)) else { return nil }
        defer { try? handle.close() }
        do {
            try handle.seek(toOffset: UInt64(offset))
            return try handle.read(upToCount: length) ?? Data()
        } catch {
            throw .cannotRead(path: path(for: hash), detail: error.localizedDescription)
        }
    }

    /// The hashes whose complete bytes are here.
    public func storedHashes() -> [AttachmentHash] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).compactMap { AttachmentHash(hex: $0) }.sorted()
    }

    /// The hashes with a `.partial` file, and its size.
    public func partialFiles() -> [AttachmentHash: Int64] {
        var result: [AttachmentHash: Int64] = [:]
        for name in (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [] where name.hasSuffix(".partial") {
            if let hash = AttachmentHash(hex: name.dropLast(".partial".count)), let size = partialSize(of: hash) {
                result[hash] = size
            }
        }
        return result
    }

    /// When the complete file of `hash` was last written, or nil if it is not here.
    public func modificationDate(of hash: AttachmentHash) -> Date? {
        (try? FileManager.default.attributesOfItem(atPath: path(for: hash)))?[.modificationDate] as? Date
    }

    // MARK: - Transfers

    /// Writes `bytes` at `offset` of the `.partial` file of `hash`, which must hold at least
    /// `offset` bytes; anything after `offset` is dropped first (a resumed range overwrites).
    public func writePartial(_ hash: AttachmentHash, offset: Int64, bytes: some Collection<UInt8>) throws(AttachmentError) {
        let path = partialPath(for: hash)
        try createDirectory()
        let existing = fileSize(path) ?? 0
        guard offset <= existing else { throw .notContiguous(hash: hash, offset: offset, partialBytes: existing) }
        if fileSize(path) == nil { _ = FileManager.default.createFile(atPath: path, contents: nil) }
        do {
            let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
            defer { try? handle.close() }
            try handle.truncate(atOffset: UInt64(offset))
            try handle.seek(toOffset: UInt64(offset))
            try handle.write(contentsOf: Data(bytes))
        } catch {
            throw .cannotWrite(path: path, detail: error.localizedDescription)
        }
    }

    /// Whether the `.partial` file of `hash` hashes to `hash` (false if there is none).
    public func verifyPartial(_ hash: AttachmentHash) throws(AttachmentError) -> Bool {
        guard let handle = FileHandle(forReadingAtPath: partialPath(for: hash)) else { return false }
        defer { try? handle.close() }
        var hasher = SHA256()
        do {
            while let chunk = try handle.read(upToCount: Self.chunkBytes), !chunk.isEmpty { hasher.update(data: chunk) }
        } catch {
            throw .cannotRead(path: partialPath(for: hash), detail: error.localizedDescription)
        }
        return Array(hasher.finalize()) == hash.bytes
    }

    /// fsyncs the verified `.partial` file of `hash` and renames it to its final name.
    public func promotePartial(_ hash: AttachmentHash) throws(AttachmentError) {
        let partial = partialPath(for: hash)
        do {
            let handle = try FileHandle(forWritingTo: URL(fileURLWithPath: partial))
            try handle.synchronize()
            try handle.close()
        } catch {
            throw .cannotWrite(path: partial, detail: error.localizedDescription)
        }
        try promote(partial, to: path(for: hash))
    }

    /// Deletes the `.partial` file of `hash`, if any.
    public func discardPartial(_ hash: AttachmentHash) {
        try? FileManager.default.removeItem(atPath: partialPath(for: hash))
    }

    /// Deletes the bytes of `hash` (complete and partial). Returns whether a complete file was there.
    @discardableResult
    public func remove(_ hash: AttachmentHash) -> Bool {
        discardPartial(hash)
        return (try? FileManager.default.removeItem(atPath: path(for: hash))) != nil
    }

    // MARK: - Files

    /// Marks the file of `hash` as just added, so a purge's grace period protects it again
    /// until the record that will reference it is saved.
    private func touch(_ hash: AttachmentHash) {
        try? FileManager.default.setAttributes([.modificationDate: Date()], ofItemAtPath: path(for: hash))
    }

    /// Temporary files (`.tmp-*`) left by an add that crashed, with their modification dates.
    public func leftoverTemporaryFiles() -> [(path: String, modified: Date)] {
        ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).filter { $0.hasPrefix(".tmp-") }.compactMap { name in
            let path = (directory as NSString).appendingPathComponent(name)
            guard let date = (try? FileManager.default.attributesOfItem(atPath: path))?[.modificationDate] as? Date else { return nil }
            return (path, date)
        }
    }

    /// When the `.partial` file of `hash` was last written, or nil if there is none.
    public func partialModificationDate(of hash: AttachmentHash) -> Date? {
        (try? FileManager.default.attributesOfItem(atPath: partialPath(for: hash)))?[.modificationDate] as? Date
    }

    private func createDirectory() throws(AttachmentError) {
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        } catch {
            throw .cannotWrite(path: directory, detail: error.localizedDescription)
        }
    }

    /// Writes a new temporary file with `body`, fsyncs it and returns its path. On failure the
    /// file is removed.
    private func writeTemporary(_ body: (FileHandle) throws(AttachmentError) -> Void) throws(AttachmentError) -> String {
        try createDirectory()
        let temporary = (directory as NSString).appendingPathComponent(".tmp-\(UUID().uuidString)")
        guard FileManager.default.createFile(atPath: temporary, contents: nil) else {
            throw .cannotWrite(path: directory, detail: "cannot create a file there")
        }
        do throws(AttachmentError) {
            let handle: FileHandle
            do {
                handle = try FileHandle(forWritingTo: URL(fileURLWithPath: temporary))
            } catch {
                throw .cannotWrite(path: temporary, detail: error.localizedDescription)
            }
            defer { try? handle.close() }
            try body(handle)
            do { try handle.synchronize() } catch {
                throw .cannotWrite(path: temporary, detail: error.localizedDescription)
            }
        } catch {
            try? FileManager.default.removeItem(atPath: temporary)
            throw error
        }
        return temporary
    }

    private func writeAtomically(_ hash: AttachmentHash, _ body: (FileHandle) throws -> Void) throws(AttachmentError) {
        let temporary = try writeTemporary { handle throws(AttachmentError) in
            do { try body(handle) } catch {
                throw .cannotWrite(path: directory, detail: error.localizedDescription)
            }
        }
        try promote(temporary, to: path(for: hash))
    }

    /// Renames `source` over `destination` (atomic; identical content if it existed) and
    /// fsyncs the directory so the new name survives a power loss.
    private func promote(_ source: String, to destination: String) throws(AttachmentError) {
        guard rename(source, destination) == 0 else {
            let detail = String(cString: strerror(errno))
            try? FileManager.default.removeItem(atPath: source)
            throw .cannotWrite(path: destination, detail: detail)
        }
        let fd = open(directory, O_RDONLY)
        if fd >= 0 {
            _ = fsync(fd)
            _ = close(fd)
        }
    }

    private func fileSize(_ path: String) -> Int64? {
        guard let size = (try? FileManager.default.attributesOfItem(atPath: path))?[.size] as? NSNumber else { return nil }
        return size.int64Value
    }
}
