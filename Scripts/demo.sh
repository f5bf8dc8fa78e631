#!/usr/bin/env bash
# The main command: installs what is missing, builds peersync, and runs its showcase:
# `peersync demo` (several local replicas editing concurrently and converging on screen).
# Any arguments go to peersync instead, e.g. Scripts/demo.sh run --store ~/peersync
set -euo pipefail
cd "$(dirname "$0")/.."
Scripts/setup.sh
swift build --product peersync 2>&1 | grep -E "error:|warning:|Build complete" || true
exec .build/debug/peersync "${@:-demo}"
