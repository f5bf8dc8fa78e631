import Foundation
import Logging
@testable import PeerSync
import PeerSyncModel
import PeerSyncTestSupport
import Synchronization
import Testing
import ShiftSchedulerModel

/// A logger that stays quiet unless PEERSYNC_TEST_LOG is set.
func testLogger(_ label: String) -> Logger {
    var logger = Logger(label: "test.\(label)")
    logger.logLevel = ProcessInfo.processInfo.environment["PEERSYNC_TEST_LOG"] == nil ? .critical : .debug
    return logger
}

/// Devices of one group for every replica these tests make (so any two can sync).
let appGroup = try! LocalGroup.make(names: (0..<120).map { "app\($0)" })
private let nextDevice = Atomic<Int>(0)

/// A replica in a fresh temporary directory (removed by `close()`), a device of ``appGroup``.
final class TestApp: Sendable {
    let directory: String
    let replica: Replica

    init(_ name: String, logger: Logger? = nil) throws {
        directory = try makeTemporaryDirectory("peersync-app")
        let member = nextDevice.wrappingAdd(1, ordering: .relaxed).oldValue
        replica = try Replica.create(at: directory, member: member, of: appGroup, name: name, logger: logger ?? testLogger(name))
    }

    /// Another `Replica` over the same directory (as a second process would open it).
    init(sharing other: TestApp, name: String) throws {
        directory = other.directory
        replica = try Replica.open(at: directory, name: name, logger: testLogger(name))
    }

    func close() async {
        await replica.stopSync()
        removeTemporaryDirectory(directory)
    }
}

/// Starts sync on both over 127.0.0.1 (`b` dials `a`) and waits until they are connected.
func connect(_ a: Replica, _ b: Replica) async throws {
    let port = try await a.startSync(SyncConfiguration(security: .tls, listen: .loopback(0)))
    try await b.startSync(SyncConfiguration(security: .tls, listen: .loopback(0), peers: [.loopback(port)]))
    let connected = await eventually {
        let (fromA, fromB) = (await a.peers(), await b.peers())
        return !fromA.isEmpty && !fromB.isEmpty
    }
    try #require(connected, "the two replicas did not connect")
}

/// Iterates an observation in a task and keeps every element, for tests that wait for
/// elements with a deadline.
final class Recorder<Element: Sendable>: Sendable {
    private final class Storage: Sendable {
        let elements = Mutex<[Element]>([])
        let failure = Mutex<String?>(nil)
    }
    private let storage = Storage()
    private let task: Task<Void, Never>

    init(_ observation: ReplicaObservation<Element>) {
        task = Task { [storage] in
            do {
                for try await element in observation { storage.elements.withLock { $0.append(element) } }
            } catch {
                storage.failure.withLock { $0 = "\(error)" }
            }
        }
    }

    var all: [Element] { storage.elements.withLock { $0 } }
    var count: Int { storage.elements.withLock { $0.count } }
    var last: Element? { storage.elements.withLock { $0.last } }
    var error: String? { storage.failure.withLock { $0 } }

    /// Waits until at least `count` elements arrived; returns whether they did in time.
    func wait(count: Int, timeout: Duration = .seconds(60)) async -> Bool {
        await eventually(timeout: timeout, every: .milliseconds(2)) { self.count >= count }
    }

    /// Waits until the last element satisfies `condition`.
    func wait(timeout: Duration = .seconds(60), until condition: @escaping (Element) -> Bool) async -> Bool {
        await eventually(timeout: timeout, every: .milliseconds(2)) { self.last.map(condition) ?? false }
    }

    func stop() {
        task.cancel()
    }

    deinit { stop() }
}

/// Waits until observations of `replica` have looked at changes `rounds` more times than
/// `before` (so a change known to have been published was processed, emitting or not).
func waitForRounds(_ replica: Replica, after before: Int, rounds: Int = 1) async -> Bool {
    await eventually(timeout: .seconds(60), every: .milliseconds(1)) { replica.appSupport.observationRounds >= before + rounds }
}

/// PeerSync's attachment (Swift Testing has a type of that name too).
typealias Attachment = PeerSyncModel.Attachment

/// Titles of shift types, for readable expectations.
func titles(_ shiftTypes: [ShiftType]) -> [String] { shiftTypes.map(\.title) }
