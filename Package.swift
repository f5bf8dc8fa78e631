// swift-tools-version: 6.1
import PackageDescription

// Layers (imports point down only):
//   peersync (CLI), Examples, Benchmarks; ShiftSchedulerModel (the demo app's records, Examples/Shared)
//   PeerSync          — the engine apps import
//   PeerSyncNetwork   — TCP, TLS, NIO (the only library code that imports NIO)
//   PeerSyncReplication — the pure replication core and the replicator (any transport, no NIO)
//   PeerSyncStore     — durable replica store (SQLite via GRDB)
//   PeerSyncModel     — typed records, collections, settings, conflict log
//   PeerSyncCRDT      — value-type CRDTs: clocks, dots, causal context, registers, sets, record map
let package = Package(
    name: "PeerSync",
    // Synchronization.Mutex (store, engine, sessions) needs macOS 15 / iOS 18.
    platforms: [.macOS(.v15), .iOS(.v18)],
    products: [
        .library(name: "PeerSync", targets: ["PeerSync"]),
        .executable(name: "peersync", targets: ["peersync"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-crypto", from: "4.5.2"),
        .package(url: "https://github.com/apple/swift-certificates", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-asn1", from: "1.7.4"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
    ],
    targets: [
        .target(name: "PeerSyncCRDT"),
        .target(name: "PeerSyncModel", dependencies: ["PeerSyncCRDT"]),
        .target(
            name: "PeerSyncStore",
            dependencies: ["PeerSyncCRDT", "PeerSyncModel", .product(name: "GRDB", package: "GRDB.swift"),
                           .product(name: "GRDBSQLite", package: "GRDB.swift"),
                           .product(name: "Crypto", package: "swift-crypto")]
        ),
        // DNS-SD C API; on Linux Avahi's Bonjour compatibility library (on Apple platforms: the system's dnssd).
        // The header by its path under /usr/include (shim.h), not through pkg-config: its
        // -D_REENTRANT made SwiftPM print "prohibited flag(s)" on every build.
        .systemLibrary(
            name: "CDNSSD",
            providers: [.apt(["libavahi-compat-libdnssd-dev"])]
        ),
        .target(
            name: "PeerSyncDiscovery",
            dependencies: ["PeerSyncCRDT", .target(name: "CDNSSD", condition: .when(platforms: [.linux]))]
        ),
        // zlib's raw DEFLATE for catch-up chunks (on Apple platforms: the SDK's libz).
        .systemLibrary(name: "CZlib", providers: [.apt(["zlib1g-dev"])]),
        .target(name: "PeerSyncWire", dependencies: ["PeerSyncCRDT", "CZlib"]),
        // Device identities and the signed roster (pure: no NIO, no store).
        .target(
            name: "PeerSyncIdentity",
            dependencies: [
                "PeerSyncCRDT",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "X509", package: "swift-certificates"),
                .product(name: "SwiftASN1", package: "swift-asn1"),
            ]
        ),
        // Sealed data for relays (issue 33): data keys by epoch, key envelopes (HPKE to device
        // keys), sealed blobs. Pure: formats and cryptography, no I/O.
        .target(
            name: "PeerSyncSeal",
            dependencies: ["PeerSyncCRDT", "PeerSyncIdentity", .product(name: "Crypto", package: "swift-crypto")]
        ),
        // The relay (issue 33): its messages, its decisions per group (pure), its storage behind
        // one protocol (SQLite through GRDB) and the service that serves groups. No NIO: the
        // network listener is PeerSyncNetwork's.
        .target(
            name: "PeerSyncRelay",
            dependencies: ["PeerSyncCRDT", "PeerSyncIdentity", "PeerSyncSeal", "PeerSyncWire", "PeerSyncReplication",
                           .product(name: "GRDB", package: "GRDB.swift"), .product(name: "Crypto", package: "swift-crypto"),
                           .product(name: "Logging", package: "swift-log")]
        ),
        // Replication: the pure core (sessions as state machines) and the replicator that runs it
        // over any transport. No NIO here: a transport is bytes in, bytes out.
        .target(
            name: "PeerSyncReplication",
            dependencies: [
                "PeerSyncCRDT", "PeerSyncModel", "PeerSyncWire", "PeerSyncIdentity",
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // Networking: TCP, TLS and NIO — the only library code that imports NIO.
        .target(
            name: "PeerSyncNetwork",
            dependencies: [
                "PeerSyncCRDT", "PeerSyncWire", "PeerSyncIdentity", "PeerSyncReplication", "PeerSyncRelay",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .target(
            name: "PeerSync",
            dependencies: ["PeerSyncCRDT", "PeerSyncModel", "PeerSyncStore", "PeerSyncWire", "PeerSyncReplication", "PeerSyncNetwork", "PeerSyncDiscovery",
                           "PeerSyncIdentity", "PeerSyncSeal", "PeerSyncRelay",
                           .product(name: "Logging", package: "swift-log")]
        ),
        // The ShiftScheduler demo app's records (ShiftType, Location) and the JSON export/import
        // `peersync export`/`import` use: app code, not part of the PeerSync library.
        .target(name: "ShiftSchedulerModel", dependencies: ["PeerSyncCRDT", "PeerSyncModel"],
                path: "Examples/Shared/ShiftSchedulerModel"),
        .executableTarget(
            name: "peersync",
            dependencies: [
                "PeerSync", "PeerSyncDiscovery", "ShiftSchedulerModel", "PeerSyncRelay", "PeerSyncNetwork", "PeerSyncIdentity",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]
        ),
        .executableTarget(
            name: "PeerSyncBenchmarks",
            dependencies: ["PeerSync", "PeerSyncWire", "ShiftSchedulerModel", .product(name: "Logging", package: "swift-log"), .product(name: "Crypto", package: "swift-crypto"),
                           "PeerSyncRelay", "PeerSyncSeal", "PeerSyncNetwork", "PeerSyncIdentity", "PeerSyncCRDT", "PeerSyncReplication",
                           .product(name: "NIOSSL", package: "swift-nio-ssl"), .product(name: "NIOPosix", package: "swift-nio"),
                           .product(name: "NIOTLS", package: "swift-nio")],
            path: "Benchmarks/PeerSyncBenchmarks"
        ),
        .executableTarget(name: "example-shift-scheduler", dependencies: ["PeerSync", "ShiftSchedulerModel", .product(name: "Logging", package: "swift-log")],
                          path: "Examples/ShiftScheduler"),
        .executableTarget(name: "example-settings", dependencies: ["PeerSync"], path: "Examples/SettingsScopes"),
        // An app's whole sync layer (issue 31): SyncLayer.swift, at most 50 lines (CI checks).
        .executableTarget(name: "example-team-sync", dependencies: ["PeerSync"], path: "Examples/TeamSync"),
        .executableTarget(name: "example-in-memory-pipe", dependencies: ["PeerSync", "ShiftSchedulerModel", .product(name: "Logging", package: "swift-log")],
                          path: "Examples/InMemoryPipe"),
        .executableTarget(name: "example-app-streams", dependencies: ["PeerSync", "ShiftSchedulerModel", .product(name: "Logging", package: "swift-log")],
                          path: "Examples/AppStreams"),
        .executableTarget(name: "example-observable-app", dependencies: ["PeerSync", "ShiftSchedulerModel", .product(name: "Logging", package: "swift-log")],
                          path: "Examples/ObservableApp"),
        .target(name: "PeerSyncTestSupport", dependencies: ["PeerSyncCRDT", .product(name: "Logging", package: "swift-log")],
                path: "Tests/PeerSyncTestSupport"),
        // Replicas linked through the app-transport session API, reconnecting (app and session tests).
        .target(name: "PeerSyncAppTestSupport", dependencies: ["PeerSync"], path: "Tests/PeerSyncAppTestSupport"),
        // Every Swift block of the README, the DocC articles and docs/APPLE.md, compiled
        // (Scripts/doc-snippets.py generates them; issue 31: docs that compile).
        .testTarget(name: "DocSnippets", dependencies: ["PeerSync"], path: "Tests/DocSnippets"),
        .testTarget(name: "PeerSyncCRDTTests", dependencies: ["PeerSyncCRDT", "PeerSyncTestSupport"]),
        .testTarget(name: "PeerSyncSealTests", dependencies: ["PeerSyncSeal", "PeerSyncIdentity", "PeerSyncCRDT",
                                                               .product(name: "Crypto", package: "swift-crypto")]),
        .testTarget(name: "PeerSyncRelayTests", dependencies: ["PeerSyncRelay", "PeerSyncSeal", "PeerSyncIdentity", "PeerSyncCRDT", "PeerSyncReplication"]),
        .testTarget(name: "PeerSyncModelTests", dependencies: ["PeerSyncModel", "ShiftSchedulerModel", "PeerSyncCRDT", "PeerSyncTestSupport"]),
        .executableTarget(
            name: "peersync-store-child",
            dependencies: ["PeerSyncStore", "PeerSyncModel", "ShiftSchedulerModel"],
            path: "Tests/StoreChild"
        ),
        .testTarget(
            name: "PeerSyncSessionTests",
            dependencies: [
                "PeerSync", "PeerSyncReplication", "PeerSyncNetwork", "PeerSyncWire", "PeerSyncStore", "PeerSyncTestSupport", "PeerSyncIdentity", "ShiftSchedulerModel",
                "PeerSyncAppTestSupport",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOTestUtils", package: "swift-nio"),
                .product(name: "NIOEmbedded", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOTLS", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .executableTarget(name: "peersync-wire-fuzz", dependencies: ["PeerSyncWire", "PeerSyncCRDT"], path: "Tests/WireFuzz",
                          exclude: ["corpus"]),
        .executableTarget(name: "peersync-structured-fuzz", dependencies: ["PeerSyncWire", "PeerSyncCRDT"], path: "Tests/StructuredFuzz"),
        .testTarget(name: "PeerSyncCLITests", dependencies: ["PeerSyncTestSupport", "peersync", "ShiftSchedulerModel", "PeerSyncStore", "PeerSyncModel"]),
        .testTarget(
            name: "PeerSyncReliabilityTests",
            dependencies: [
                "PeerSync", "PeerSyncTestSupport", "peersync", "ShiftSchedulerModel",
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
            ]
        ),
        .testTarget(
            name: "PeerSyncIdentityTests",
            dependencies: ["PeerSyncIdentity", "PeerSyncCRDT", "PeerSyncTestSupport",
                           .product(name: "Crypto", package: "swift-crypto"),
                           .product(name: "X509", package: "swift-certificates")]
        ),
        .testTarget(name: "PeerSyncWireTests", dependencies: ["PeerSyncWire", "PeerSyncCRDT", "PeerSyncTestSupport"]),
        // docs/vectors: every vector file checked against the code (PEERSYNC_WRITE_VECTORS=1 rewrites them).
        .testTarget(
            name: "PeerSyncVectorTests",
            dependencies: ["PeerSyncWire", "PeerSyncCRDT", "PeerSyncIdentity", "PeerSyncReplication", "PeerSyncNetwork", "PeerSyncDiscovery",
                           .product(name: "Crypto", package: "swift-crypto"), "PeerSyncSeal", "PeerSyncRelay"]
        ),
        .testTarget(
            name: "PeerSyncStoreTests",
            dependencies: ["PeerSyncStore", "PeerSyncModel", "PeerSyncCRDT", "PeerSyncTestSupport", "ShiftSchedulerModel", "peersync-store-child"]
        ),
        // Live queries, the observable model, batches, references, conflicts and attachments;
        // the child writes batches (killed with SIGKILL) and plays "another process".
        .executableTarget(name: "peersync-app-child", dependencies: ["PeerSync", "ShiftSchedulerModel"], path: "Tests/AppChild"),
        .testTarget(
            name: "PeerSyncAppTests",
            dependencies: ["PeerSync", "PeerSyncWire", "PeerSyncTestSupport", "PeerSyncAppTestSupport", "ShiftSchedulerModel", "peersync-app-child",
                           .product(name: "Logging", package: "swift-log"), .product(name: "Crypto", package: "swift-crypto"), "PeerSyncSeal",
                           "PeerSyncRelay", "PeerSyncNetwork", "PeerSyncReplication"]
        ),
        .executableTarget(
            name: "peersync-discovery-probe",
            dependencies: ["PeerSyncDiscovery", "PeerSyncCRDT"],
            path: "Tests/DiscoveryProbe"
        ),
        .testTarget(
            name: "PeerSyncDiscoveryTests",
            dependencies: ["PeerSyncDiscovery", "PeerSyncCRDT", "PeerSyncTestSupport", "peersync-discovery-probe"]
        ),
    ],
    swiftLanguageModes: [.v6]
)
