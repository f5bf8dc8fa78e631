// swift-tools-version: 6.1
import PackageDescription

// Layers (imports point down only):
//   peersync (CLI), Examples, Benchmarks
//   PeerSync          — the engine apps import
//   PeerSyncStore     — durable replica store (SQLite via GRDB)
//   PeerSyncModel     — typed records, collections, settings, conflict log
//   PeerSyncCRDT      — value-type CRDTs: clocks, dots, causal context, registers, sets, record map
let package = Package(
    name: "PeerSync",
    platforms: [.macOS(.v14)],
    products: [
        .library(name: "PeerSync", targets: ["PeerSync"]),
        .executable(name: "peersync", targets: ["peersync"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
    ],
    targets: [
        .target(name: "PeerSyncCRDT"),
        .target(name: "PeerSyncModel", dependencies: ["PeerSyncCRDT"]),
        .target(
            name: "PeerSyncStore",
            dependencies: ["PeerSyncCRDT", "PeerSyncModel", .product(name: "GRDB", package: "GRDB.swift")]
        ),
        .target(name: "PeerSync", dependencies: ["PeerSyncCRDT", "PeerSyncModel", "PeerSyncStore"]),
        .executableTarget(
            name: "peersync",
            dependencies: [
                "PeerSync",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),
        .executableTarget(
            name: "PeerSyncBenchmarks",
            dependencies: ["PeerSyncCRDT", "PeerSyncModel", "PeerSyncStore"],
            path: "Benchmarks/PeerSyncBenchmarks"
        ),
        .target(name: "PeerSyncTestSupport", dependencies: ["PeerSyncCRDT"], path: "Tests/PeerSyncTestSupport"),
        .testTarget(name: "PeerSyncCRDTTests", dependencies: ["PeerSyncCRDT", "PeerSyncTestSupport"]),
        .testTarget(name: "PeerSyncModelTests", dependencies: ["PeerSyncModel", "PeerSyncCRDT", "PeerSyncTestSupport"]),
        .executableTarget(
            name: "peersync-store-child",
            dependencies: ["PeerSyncStore", "PeerSyncModel"],
            path: "Tests/StoreChild"
        ),
        .testTarget(
            name: "PeerSyncStoreTests",
            dependencies: ["PeerSyncStore", "PeerSyncModel", "PeerSyncCRDT", "PeerSyncTestSupport", "peersync-store-child"]
        ),
    ],
    swiftLanguageModes: [.v6]
)
