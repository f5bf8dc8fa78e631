#!/usr/bin/env bash
# The long reliability run, by hand: 50 crash trials per scenario, the lab fault suite, the
# hostile-peer suite, and 2 million fuzz inputs. (CI runs the same suites with 10 trials and
# 50,000 fuzz inputs as part of Scripts/test.sh.)
#   Scripts/reliability.sh [TRIALS] [FUZZ_RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
Scripts/setup.sh
swift build --build-tests 2>&1 | grep -E "error:|Build complete" || true
PEERSYNC_TRIALS=${1:-50} swift test --skip-build --disable-xctest \
  --filter "CrashTests|HostilePeerTests|LabFaultTests|BadInputTests|HostileFramesTests" 2>&1 \
  | grep -E "^(✘|✔ Test run)|recorded an issue|reliability:" || true
# Retention with 12,000 one-commit store instances (~8 min in a debug build).
PEERSYNC_LONG=1 swift test --skip-build --disable-xctest --filter "retentionAcrossShortLivedWriters" 2>&1 \
  | grep -E "^(✘|✔ Test run)|recorded an issue|retention:" || true
Scripts/fuzz.sh "${2:-2000000}"
