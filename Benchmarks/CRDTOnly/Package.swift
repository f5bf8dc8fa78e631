// swift-tools-version: 6.0
// The CRDT alone, for measuring it in a release build without the network stack (BoringSSL,
// NIO: a full release build takes ~7 min on the project machine, this one ~2):
//   cd Benchmarks/CRDTOnly && swift build -c release && .build/release/w3-memory
//   .build/release/w2-apply        # W2's 10,000 one-field deltas joined in memory (issue 30)
// Sources/PeerSyncCRDT and Sources/PeerSyncModel are symbolic links to the package's own modules.
import PackageDescription

let package = Package(
    name: "CRDTOnly",
    targets: [
        .target(name: "PeerSyncCRDT"),
        .target(name: "PeerSyncModel", dependencies: ["PeerSyncCRDT"]),
        .executableTarget(name: "w3-memory", dependencies: ["PeerSyncCRDT"]),
        .executableTarget(name: "w2-apply", dependencies: ["PeerSyncCRDT", "PeerSyncModel"]),
    ],
    swiftLanguageModes: [.v6]
)
