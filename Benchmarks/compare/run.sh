#!/usr/bin/env bash
# Issue 13 comparison: create N records on three devices, delete them all, compare full-state
# bytes after deleting everything. Usage: Benchmarks/compare/run.sh [N]   (default 100000)
# Needs python3 (venv: pycrdt, loro from PyPI) and the Swift toolchain. Automerge runs only where
# the npm registry is reachable (delete_all.mjs, @automerge/automerge); PyPI has no maintained
# Automerge binding with save(), and this workplace reaches PyPI and Debian only.
set -euo pipefail
N=${1:-100000}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
WORK=${COMPARE_WORK:-/tmp/peersync-compare}
mkdir -p "$WORK/swift/Sources" "$WORK/am"
[ -x "$WORK/venv/bin/python3" ] || python3 -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q pycrdt==0.14.13 loro==1.17.1
HAVE_AM=0
if command -v npm >/dev/null; then
    ( cd "$WORK/am" && { [ -d node_modules/@automerge/automerge ] || { npm init -y >/dev/null && npm install --silent @automerge/automerge@3.5.0; }; } ) \
        && HAVE_AM=1 || echo '{"system": "Automerge", "error": "npm registry not reachable"}'
fi
ln -sfn "$ROOT/Sources/PeerSyncCRDT" "$WORK/swift/Sources/PeerSyncCRDT"
ln -sfn "$HERE/PeerSyncDeleteAll" "$WORK/swift/Sources/PeerSyncDeleteAll"
cat > "$WORK/swift/Package.swift" <<'PKG'
// swift-tools-version: 6.1
import PackageDescription
let package = Package(name: "Compare", platforms: [.macOS(.v15)], targets: [
    .target(name: "PeerSyncCRDT"),
    .executableTarget(name: "PeerSyncDeleteAll", dependencies: ["PeerSyncCRDT"]),
])
PKG
( cd "$WORK/swift" && swift build -c release --product PeerSyncDeleteAll >/dev/null )
cp "$HERE/delete_all.mjs" "$WORK/am/"
"$WORK/swift/.build/release/PeerSyncDeleteAll" "$N"
"$WORK/venv/bin/python3" "$HERE/delete_all.py" "$N"
if [ "$HAVE_AM" = 1 ]; then ( cd "$WORK/am" && node delete_all.mjs "$N" ); fi
