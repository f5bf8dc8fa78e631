#!/usr/bin/env bash
# The main command: installs what is missing, builds peersync, and shows it.
set -euo pipefail
cd "$(dirname "$0")/.."
Scripts/setup.sh
swift build --product peersync 2>&1 | grep -E "error:|warning:|Build complete" || true
exec .build/debug/peersync "${@:---help}"
