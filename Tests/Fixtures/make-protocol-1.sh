#!/usr/bin/env bash
# Regenerates Tests/Fixtures/protocol-1 (README.md beside this script) with a `peersync` binary
# of protocol version 1, i.e. built at commit 576a906:
#   git worktree add /tmp/old 576a906 && (cd /tmp/old && swift build --product peersync)
#   Tests/Fixtures/make-protocol-1.sh /tmp/old/.build/debug/peersync
# Two stores of one group ("office", "laptop") sync over 127.0.0.1, stop, and the laptop then
# makes one edit offline that the office never sees.
set -euo pipefail
ps=${1:?usage: make-protocol-1.sh PATH-TO-PROTOCOL-1-PEERSYNC}
out="$(cd "$(dirname "$0")" && pwd)/protocol-1"
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
o="$work/office" l="$work/laptop"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

"$ps" init --store "$o" --name office
code=$("$ps" invite --store "$o")
"$ps" init --store "$l" --name laptop --join "$code"
main=$("$ps" location add --store "$o" --name "Main office" --address "1 High Street")
"$ps" location add --store "$o" --name "Warehouse" --address "Dock 4" >/dev/null
"$ps" shift-type add --store "$o" --symbol E --title Early --duration 8h --location "$main" >/dev/null
"$ps" shift-type add --store "$l" --symbol N --title Night --duration 10h --description "till six" >/dev/null
"$ps" settings set weekStart 2 --store "$o"
"$ps" settings set theme '"dark"' --local --store "$l"

p1=$(port); p2=$(port)
"$ps" run --store "$o" --listen "127.0.0.1:$p1" --no-discovery --log-level warning & pids+=($!)
"$ps" run --store "$l" --listen "127.0.0.1:$p2" --peer "127.0.0.1:$p1" --no-discovery --log-level warning & pids+=($!)
digest() { "$ps" status --store "$1" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["digest"])'; }
for _ in $(seq 120); do   # at most 60 s
    [ "$(digest "$o")" = "$(digest "$l")" ] && break
    sleep 0.5
done
[ "$(digest "$o")" = "$(digest "$l")" ] || { echo "the two stores did not converge" >&2; exit 1; }
kill -TERM "${pids[@]}"; wait "${pids[@]}" || true; pids=()

# One edit the office never sees.
"$ps" shift-type add --store "$l" --symbol L --title Late --duration 7h30m >/dev/null

rm -rf "$out"; mkdir -p "$out/office" "$out/laptop"
for name in office laptop; do
    for f in "$work/$name"/*; do
        case "$(basename "$f")" in node.json|*.lock|*-shm) ;; *) cp "$f" "$out/$name/" ;; esac
    done
done
ls -la "$out"/*
