#!/usr/bin/env bash
# Fuzzes the wire decoders (frames, messages, session deltas, stored blobs) with libFuzzer.
#   Scripts/fuzz.sh [RUNS]     default 200000 inputs (about a minute); CI runs fewer
# Crashes land in .build-fuzz/crashes/; turn each into a regression test in
# Tests/PeerSyncWireTests (the corpus in Tests/WireFuzz/corpus is replayed by the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-200000}
swift build -c debug --sanitize=fuzzer --sanitize=address -Xswiftc -sanitize=fuzzer,address \
  --product peersync-wire-fuzz --scratch-path .build-fuzz 2>&1 | grep -E "error|warning: .*Tests/WireFuzz|Build complete" || true
binary=.build-fuzz/debug/peersync-wire-fuzz
[ -x "$binary" ] || { echo "fuzz build failed" >&2; exit 1; }
mkdir -p .build-fuzz/crashes .build-fuzz/corpus
cp -n Tests/WireFuzz/corpus/* .build-fuzz/corpus/ 2>/dev/null || true
SWIFT_BACKTRACE=enable=no "$binary" -runs="$runs" -use_value_profile=1 -max_len=4096 \
  -artifact_prefix=.build-fuzz/crashes/ .build-fuzz/corpus 2>&1 | tail -5
echo "fuzz: $runs inputs, no crash"
