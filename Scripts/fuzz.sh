#!/usr/bin/env bash
# Fuzzes the decoders with libFuzzer (debug build with ASan), two targets:
#   peersync-wire-fuzz        random bytes into the frame, message, session-delta and blob decoders
#   peersync-structured-fuzz  well-formed messages built from the input as a stream of choices,
#                             full of boundary values, through every decoder, the join, the
#                             context operations and the digest (Tests/StructuredFuzz/main.swift)
#
#   Scripts/fuzz.sh [RUNS] [STRUCTURED_RUNS]   RUNS wire inputs (default 200000, about a minute)
#                                              and STRUCTURED_RUNS structured ones (default 50000),
#                                              the latter also bounded to 60 s
#                                              (PEERSYNC_FUZZ_SECONDS); CI uses the defaults
#   Scripts/fuzz.sh --long                     2,000,000 wire and 10,000,000 structured inputs
#                                              (hours; docs/RELIABILITY.md)
# Crashes land in .build-fuzz/crashes/; turn each into a regression test in Tests/PeerSyncWireTests
# or Tests/PeerSyncCRDTTests (the corpus in Tests/WireFuzz/corpus is replayed by the tests).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--long" ]; then
  runs=2000000
  structured_runs=10000000
  structured_seconds=0  # no time bound
else
  runs=${1:-200000}
  structured_runs=${2:-50000}
  structured_seconds=${PEERSYNC_FUZZ_SECONDS:-60}  # ~200 inputs/s under ASan: the time bound comes first
fi
for product in peersync-wire-fuzz peersync-structured-fuzz; do
  swift build -c debug --sanitize=fuzzer --sanitize=address -Xswiftc -sanitize=fuzzer,address \
    --product "$product" --scratch-path .build-fuzz 2>&1 | grep -E "error|warning: .*Tests/(WireFuzz|StructuredFuzz)|Build complete" || true
  [ -x ".build-fuzz/debug/$product" ] || { echo "fuzz build of $product failed" >&2; exit 1; }
done
mkdir -p .build-fuzz/crashes .build-fuzz/corpus .build-fuzz/structured-corpus
cp -n Tests/WireFuzz/corpus/* .build-fuzz/corpus/ 2>/dev/null || true

SWIFT_BACKTRACE=enable=no .build-fuzz/debug/peersync-wire-fuzz -runs="$runs" -use_value_profile=1 -max_len=4096 \
  -artifact_prefix=.build-fuzz/crashes/ .build-fuzz/corpus 2>&1 | tail -5
echo "fuzz (wire): $runs inputs, no crash"

# The structured target's inputs are choices, not frames: 512 bytes make several messages.
SWIFT_BACKTRACE=enable=no .build-fuzz/debug/peersync-structured-fuzz -runs="$structured_runs" -max_total_time="$structured_seconds" -max_len=512 \
  -rss_limit_mb=4096 -artifact_prefix=.build-fuzz/crashes/structured- .build-fuzz/structured-corpus 2>&1 | tail -5
bound=""; [ "$structured_seconds" != 0 ] && bound=" or $structured_seconds s"
echo "fuzz (structured): up to $structured_runs inputs$bound, no crash"
