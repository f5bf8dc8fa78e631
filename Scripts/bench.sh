#!/usr/bin/env bash
# The by-hand full benchmark run (docs/BENCHMARKS.md): release build, every benchmark, results in
# benchmark-results/ (git-ignored): results.json, convergence.svg, stdout.txt, compare.json.
#   Scripts/bench.sh                 # everything
#   Scripts/bench.sh mesh w2-stream  # only these
#   PEERSYNC_BEFORE=../perf-before Scripts/bench.sh w3-partition
#       # also runs an older build's benchmarks first (its own release build in that worktree,
#       # `swift build -c release` there), the same names where it has them: before.json, and the
#       # chart draws both
# The comparison with other CRDT libraries (Benchmarks/compare: pycrdt, Loro, Automerge) runs in
# the same session when python3 has them (`pip install pycrdt loro automerge`).
# All traffic stays on 127.0.0.1; the multiprocess benchmark starts `peersync run --no-discovery`.
set -euo pipefail
cd "$(dirname "$0")/.."
swift build -c release --product PeerSyncBenchmarks
swift build -c release --product peersync   # multiprocess runs the peersync binary next to the benchmarks
mkdir -p benchmark-results
before_args=()
if [[ -n "${PEERSYNC_BEFORE:-}" ]]; then
    old="$PEERSYNC_BEFORE/.build/release/PeerSyncBenchmarks"
    [[ -x "$old" ]] || { echo "no $old: build it (cd $PEERSYNC_BEFORE && swift build -c release --product PeerSyncBenchmarks --product peersync)" >&2; exit 2; }
    names=("$@")
    if [[ ${#names[@]} -eq 0 ]]; then
        # Every benchmark the old build knows (its usage line lists them).
        read -r -a names <<< "$("$old" --help | sed -n 's/.*\[\([a-z0-9|-]*\)\].*/\1/p' | tr '|' ' ')"
    fi
    rm -f benchmark-results/before-*.json
    for name in "${names[@]}"; do
        # Names the old build does not know are skipped (it exits 2 on them).
        timeout 1800 "$old" "$name" --json "benchmark-results/before-$name.json" | tee -a benchmark-results/before-stdout.txt || true
    done
    python3 - <<'EOF'
import glob, json
results = []
for path in sorted(glob.glob("benchmark-results/before-*.json")):
    if path.endswith("before.json"):
        continue
    results += json.load(open(path))
json.dump(results, open("benchmark-results/before.json", "w"), indent=2)
EOF
    before_args=(--before benchmark-results/before.json)
fi
if command -v python3 > /dev/null; then
    timeout 1800 python3 Benchmarks/compare/run_all.py --json benchmark-results/compare.json | tee benchmark-results/compare.txt || true
fi
# Bounded: the whole run takes a few minutes on 2 cores; give up after 30.
timeout 1800 .build/release/PeerSyncBenchmarks "$@" \
    --json benchmark-results/results.json --svg benchmark-results/convergence.svg "${before_args[@]}" \
    | tee benchmark-results/stdout.txt
echo "wrote benchmark-results/results.json, convergence.svg, stdout.txt (and compare.json, before.json when run)"
