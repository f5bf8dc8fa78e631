#!/usr/bin/env bash
# The by-hand full benchmark run (docs/BENCHMARKS.md): release build, every benchmark, results in
# benchmark-results/ (git-ignored): results.json, convergence.svg, stdout.txt.
#   Scripts/bench.sh                 # everything
#   Scripts/bench.sh mesh w2-stream  # only these
# All traffic stays on 127.0.0.1; the multiprocess benchmark starts `peersync run --no-discovery`.
set -euo pipefail
cd "$(dirname "$0")/.."
swift build -c release --product PeerSyncBenchmarks
swift build -c release --product peersync   # multiprocess runs the peersync binary next to the benchmarks
mkdir -p benchmark-results
# Bounded: the whole run takes a few minutes on 2 cores; give up after 30.
timeout 1800 .build/release/PeerSyncBenchmarks "$@" \
    --json benchmark-results/results.json --svg benchmark-results/convergence.svg \
    | tee benchmark-results/stdout.txt
echo "wrote benchmark-results/results.json, benchmark-results/convergence.svg, benchmark-results/stdout.txt"
