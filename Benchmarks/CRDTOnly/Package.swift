// swift-tools-version: 6.0
// The CRDT alone, for measuring it in a release build without the network stack (BoringSSL,
// NIO: a full release build takes ~7 min on the project machine, this one ~2):
//   cd Benchmarks/CRDTOnly && swift build -c release && .build/release/w3-memory
// Sources/PeerSyncCRDT is a symbolic link to the package's own module.
import PackageDescription

let package = Package(
    name: "CRDTOnly",
    targets: [
        .target(name: "PeerSyncCRDT"),
        .executableTarget(name: "w3-memory", dependencies: ["PeerSyncCRDT"]),
    ],
    swiftLanguageModes: [.v6]
)
