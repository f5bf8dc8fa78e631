#!/usr/bin/env bash
# The test command: installs what is missing, builds once (debug), fails on any compiler
# warning in PeerSync's own code, runs the whole test suite, then smoke-runs the benchmarks.
#   Scripts/test.sh            everything CI runs
#   PEERSYNC_SEED=N Scripts/test.sh   replay randomized tests from seed N
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)

Scripts/setup.sh

echo "== doc snippets (every Swift block of the README, the DocC articles and docs/APPLE.md is compiled with the tests)"
python3 Scripts/doc-snippets.py --check

log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "== build (debug, with tests)"
swift build --build-tests 2>&1 | tee "$log" | grep -E "error:|warning:|Compiling|Build complete" | grep -v "^\[" || true
if ! grep -q "Build complete" "$log"; then
  echo "build failed" >&2
  tail -50 "$log" >&2
  exit 1
fi
ours=$(grep -E "^$PWD/(Sources|Tests|Benchmarks|Examples)/.*: warning:" "$log" | sort -u || true)
if [ -n "$ours" ]; then
  echo "compiler warnings in PeerSync's own code (the house rule is none):" >&2
  echo "$ours" >&2
  exit 1
fi

echo "== public API (Scripts/api-check.sh: the type budget in docs/api-budget, doc comments, NIO only in PeerSyncNetwork)"
Scripts/api-check.sh

echo "== tests"
set +e
swift test --skip-build --disable-xctest > "$log" 2>&1
status=$?
set -e
grep -E "^(✘|✔ Test run)|recorded an issue|reliability:|discovery:" "$log" || true
if [ "$status" -ne 0 ]; then
  echo "tests failed (exit $status); failing cases above. Replay randomized ones with PEERSYNC_SEED=<seed>." >&2
  exit "$status"
fi

echo "== examples"
layer=$(wc -l < Examples/TeamSync/SyncLayer.swift)
if [ "$layer" -gt 50 ]; then
  echo "Examples/TeamSync/SyncLayer.swift is $layer lines: an app's whole sync layer must stay within 50 (issue 31)" >&2
  exit 1
fi
for example in example-shift-scheduler example-settings example-app-streams example-in-memory-pipe example-observable-app example-team-sync; do
  echo "-- $example"
  timeout 120 swift run --skip-build "$example"
done

echo "== relay lab (Scripts/relay-lab.sh: two sites in network namespaces, a relay host, a capture)"
if [ "$(id -u)" -eq 0 ] && command -v ip >/dev/null && command -v tcpdump >/dev/null && command -v avahi-daemon >/dev/null; then
  Scripts/relay-lab.sh run
else
  echo "skipped: needs root, ip, tcpdump and avahi-daemon (Scripts/setup.sh installs them)"
fi

echo "== benchmark smoke (quick mode; numbers are meaningless here, see docs/BENCHMARKS.md)"
swift run --skip-build PeerSyncBenchmarks --quick

echo "== fuzz the wire decoders (bounded: ${PEERSYNC_FUZZ_RUNS:-50000} inputs; Scripts/fuzz.sh N for more)"
Scripts/fuzz.sh "${PEERSYNC_FUZZ_RUNS:-50000}"

echo "== all passed in $(( $(date +%s) - start )) s"
