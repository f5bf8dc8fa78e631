#!/usr/bin/env bash
# The long reliability run, by hand: 50 crash trials per scenario, the lab fault suite, the
# hostile-peer suite, 20 months of a group's life (issue 29), and 2 million fuzz inputs. (CI runs the same suites with 10 trials and
# 50,000 fuzz inputs as part of Scripts/test.sh.)
#   Scripts/reliability.sh [TRIALS] [FUZZ_RUNS]
#   Scripts/reliability.sh --soak [EDITS] [RECORDS] [SECONDS]
#       the soak of issue 17 (about 10 minutes; never in CI): two `peersync run` nodes on
#       127.0.0.1, EDITS (22,000) `peersync location set` commands — each a new short-lived
#       process — on RECORDS (200) locations of the writer, paced over SECONDS (600). Every
#       1,000 edits it prints one CSV line: journal rows and file sizes of both stores, resident
#       memory of both nodes; at the end, the rate and whether the digests are equal.
#       docs/RELIABILITY.md has the figures. It runs a release `peersync` (one process per edit:
#       a debug binary manages ~9 edits/s), built with `swift build -c release --product
#       peersync`; PEERSYNC_BIN=path uses that binary instead (and builds nothing).
#   Scripts/reliability.sh --month [MONTHS] [DAYS]
#       only the month of issue 29 (MonthTests): MONTHS (20) months of DAYS (14) days, seeds
#       PEERSYNC_SEED, +1, +2, … (default 20261121); prints one line per month and the total time.
#       The full run above includes it.
set -euo pipefail
cd "$(dirname "$0")/.."

soak() {
  # dir, writer, reader, wpid and rpid are global: the EXIT trap runs after this returns.
  local bin=$1 code port
  shift
  local edits=${1:-22000} records=${2:-200} seconds=${3:-600}
  dir=$(mktemp -d /tmp/peersync-soak.XXXXXX)
  writer=$dir/writer reader=$dir/reader
  wpid='' rpid=''
  trap 'for p in $wpid $rpid; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
  "$bin" init --name writer --store "$writer" >/dev/null
  code=$("$bin" invite --store "$writer")
  "$bin" init --name reader --join "$code" --store "$reader" >/dev/null
  local ids=() i
  for i in $(seq 1 "$records"); do ids+=("$("$bin" location add --name "soak $i" --store "$writer")"); done
  "$bin" run --store "$writer" --listen 127.0.0.1:0 --no-discovery --log-level error & wpid=$!
  for i in $(seq 1 200); do  # the listening port, from the status file (at most 20 s)
    port=$(jq -r '.node.listen // empty' <("$bin" status --json --store "$writer") 2>/dev/null | sed 's/.*://')
    [ -n "$port" ] && [ "$port" != 0 ] && break
    sleep 0.1
  done
  [ -n "$port" ] || { echo "soak: the writer's node did not start" >&2; return 1; }
  "$bin" run --store "$reader" --listen 127.0.0.1:0 --no-discovery --peer "127.0.0.1:$port" --log-level error & rpid=$!

  rows() { sqlite3 "file:$1/replica.sqlite?mode=ro" ".timeout 5000" "SELECT count(*) FROM $2"; }
  bytes() { stat -c %s "$1" 2>/dev/null || echo 0; }
  rss() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
  sample() {
    echo "$1,$(( $(date +%s) - start )),$(rows "$writer" journal),$(rows "$writer" conflict),$(bytes "$writer/replica.sqlite"),$(bytes "$writer/replica.sqlite-wal"),$(rows "$reader" journal),$(bytes "$reader/replica.sqlite"),$(rss "$wpid"),$(rss "$rpid")"
  }
  echo "edits,seconds,writer_journal_rows,writer_conflict_rows,writer_db_bytes,writer_wal_bytes,reader_journal_rows,reader_db_bytes,writer_rss_kib,reader_rss_kib"
  local start n now due
  start=$(date +%s)
  sample 0
  local begun; begun=$(date +%s%N)
  for n in $(seq 1 "$edits"); do
    "$bin" location set "${ids[$((RANDOM % records))]}" --name "edit $n" --store "$writer" >/dev/null
    due=$(( begun + n * seconds * 1000000000 / edits ))
    now=$(date +%s%N)
    [ "$now" -ge "$due" ] || sleep "$(awk -v ns=$(( due - now )) 'BEGIN { printf "%.3f", ns / 1e9 }')"
    (( n % 1000 )) || sample "$n"
  done
  local took=$(( $(date +%s%N) - begun ))
  local digests=''
  for i in $(seq 1 600); do  # converged within 60 s
    digests=$( (jq -r .digest <("$bin" status --json --store "$writer"); jq -r .digest <("$bin" status --json --store "$reader")) | sort -u | wc -l)
    [ "$digests" = 1 ] && break
    sleep 0.1
  done
  sample "$edits"
  echo "soak: $edits edits in $(awk -v ns="$took" 'BEGIN { printf "%.1f", ns / 1e9 }') s" \
    "($(awk -v n="$edits" -v ns="$took" 'BEGIN { printf "%.1f", n / (ns / 1e9) }') edits/s);" \
    "digests $([ "$digests" = 1 ] && echo equal || echo DIFFER)"
  [ "$digests" = 1 ]
}

if [ "${1:-}" = --soak ]; then
  shift
  bin=${PEERSYNC_BIN:-}
  if [ -z "$bin" ]; then
    swift build -c release --product peersync 2>&1 | grep -E "error:|Build complete" || true
    bin=$(swift build -c release --show-bin-path)/peersync
  fi
  [ -x "$bin" ] || { echo "soak: no peersync binary at $bin" >&2; exit 1; }
  echo "soak: $bin ($("$bin" --version 2>/dev/null || echo "version unknown"))"
  soak "$bin" "$@"
  exit
fi

month() {
  PEERSYNC_LONG=1 PEERSYNC_MONTHS=${1:-20} PEERSYNC_MONTH_DAYS=${2:-14} \
    swift test --skip-build --disable-xctest --filter "MonthTests/month" 2>&1 \
    | grep -E "^(✘|✔ Test run)|recorded an issue|month:|^  " || true
}

if [ "${1:-}" = --month ]; then
  shift
  swift build --build-tests 2>&1 | grep -E "error:|Build complete" || true
  month "$@"
  exit
fi

Scripts/setup.sh
swift build --build-tests 2>&1 | grep -E "error:|Build complete" || true
PEERSYNC_TRIALS=${1:-50} swift test --skip-build --disable-xctest \
  --filter "CrashTests|HostilePeerTests|LabFaultTests|LimitsLabTests|BadInputTests|HostileFramesTests" 2>&1 \
  | grep -E "^(✘|✔ Test run)|recorded an issue|reliability:|limits:" || true
# Retention with 12,000 one-commit store instances (~8 min in a debug build).
PEERSYNC_LONG=1 swift test --skip-build --disable-xctest --filter "retentionAcrossShortLivedWriters" 2>&1 \
  | grep -E "^(✘|✔ Test run)|recorded an issue|retention:" || true
# A group's month (issue 29): 20 months of 14 days, five `peersync` processes each.
month
Scripts/fuzz.sh "${2:-2000000}"
