#!/usr/bin/env bash
# relay-lab.sh - PeerSync's relay lab (issue 33): two sites that never meet, joined only by a blind relay.
#
#   relay-lab.sh run     build the lab, run the scenario and its checks, print a summary table, tear
#                        everything down (also on failure or Ctrl-C). Exit 0 only if every check passed.
#                        On failure the state dir (stores, logs, capture) is kept for inspection.
#   relay-lab.sh down    stop every process of the lab, delete its namespaces and its state dir
#                        (cleans up after an interrupted or failed run)
#
# Environment: LAB_PREFIX (namespace prefix, default psr; [a-z][a-z0-9]{0,7}), LAB_DIR (state dir,
#              default /tmp/peersync-relaylab), LAB_TIMEOUT (seconds for each wait, default 30),
#              LAB_EDITS (latency edits a1 -> b1, default 20), LAB_LOOP_PORT (first of 6 loopback ports
#              for the "office" step, default 28946), PEERSYNC_BIN (default <repo>/.build/debug/peersync;
#              copied once to $LAB_DIR/bin so a rebuild cannot change it mid-run), LAB_KEEP=1 (keep the
#              state dir after a passing run too), LAB_LOG_LEVEL (nodes' log level, default info).
#
# Needs: root, ip/unshare/ss (iproute2, util-linux), dbus-daemon, avahi-daemon, tcpdump, python3
# (Scripts/setup.sh installs the packages) and a built peersync.
#
# Topology (IPv4 only, IPv6 disabled in every lab namespace):
#   site A: netns $P-sa holds bridge br0               site B: netns $P-sb holds bridge br0
#     a1  netns $P-a1  10.78.1.11  avahi                 b1  netns $P-b1  10.78.2.11  avahi
#     a2  netns $P-a2  10.78.1.12  avahi                 b2  netns $P-b2  10.78.2.12  avahi
#     c1  netns $P-c1  10.78.1.21  control pair, no avahi
#   relay host: netns $P-rl, laba 10.78.1.2 on site A's bridge, labb 10.78.2.2 on site B's;
#     net.ipv4.ip_forward=0, no avahi; runs `peersync relay` (:7947), tcpdump and control node c2.
# Each site host has one veth "lab0"; its peer (named after the host) is a port of its site's br0.
#
# Site hosts have only their /24 route, and the relay host does not forward, so nothing in site A can
# reach site B: a1/a2 and b1/b2 share data only through `peersync relay` (port 7947 on the relay host).
#
# Scenario: (1) in the root namespace, on 127.0.0.1 only and without discovery, a1 creates the group,
# a2/b1/b2 join with invites and everyone syncs once ("the team met once at the office"), and a
# separate control group c1/c2 is made the same way; (2) tcpdump starts on the relay host, the relay
# starts there and a1 enrols it from inside site A; (3) a1,a2,b1,b2 run in their sites with DNS-SD
# discovery (each host's own avahi-daemon) and --relay; checks: (a) direct peers by discovery within
# each site and every node connected to the relay, (b) a marker location a1 -> b1,b2 and b2 -> a1,
# then equal digests everywhere, (c) edit -> visible latency a1 -> b1 (p50/p99; a figure, not an
# assert), (d) the capture saw the relay's traffic, the relay stored blobs, and neither the capture
# nor the relay's files and logs hold any marker, (e) control: the insecure control group (c1 in
# site A, c2 on the relay host) puts its marker in plaintext into the capture. Also reported: each
# device's relay state once converged (nothing pending, withheld or refused), and every warning or
# error the product logged. Typical run: about 20 s.
#
# Safety (as netlab.sh): no interface is ever created in (or moved through) the root namespace: veth
# pairs are created straight between lab namespaces. dbus-daemon and avahi-daemon run only in site
# hosts, after checking that the namespace is a lab namespace other than the root/current one and
# holds only lo and lab0; avahi has allow-interfaces=lab0, use-ipv6=no, enable-wide-area=no, and
# dbus-daemon has no service directories. The root namespace only ever sees peersync on 127.0.0.1
# with --no-discovery. Every wait and loop is bounded; every process is stopped by its PID.
set -euo pipefail

P=${LAB_PREFIX:-psr}
D=${LAB_DIR:-/tmp/peersync-relaylab}
TMO=${LAB_TIMEOUT:-30}
EDITS=${LAB_EDITS:-20}
LOOP_PORT=${LAB_LOOP_PORT:-28946}
LOG_LEVEL=${LAB_LOG_LEVEL:-info}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SRC_BIN=${PEERSYNC_BIN:-$REPO/.build/debug/peersync}
SA=10.78.1
SB=10.78.2
RELAY_A=$SA.2
RELAY_B=$SB.2
RELAY_PORT=7947
NODE_PORT=7946
CONTROL_PORT=7956
IFN=lab0
MARKER=.peersync-relaylab
BIN=$D/bin/peersync
SITE_HOSTS="a1 a2 b1 b2"   # the group's devices; each runs dbus-daemon + avahi-daemon
ALL_HOSTS="a1 a2 c1 b1 b2" # every host namespace with one lab0 (c1: control, no avahi)

die() { echo "relay-lab.sh: $*" >&2; exit 1; }
log() { echo "relay-lab.sh: $*" >&2; }
# need, wait_for, pid_alive, none_alive, the avahi and dbus configurations, close_inherited_fds, stop_pids
. "$(dirname "${BASH_SOURCE[0]}")/netns-common.sh"
say() { printf '%s  %s\n' "$(date +%H:%M:%S)" "$*"; }

[[ "$P" =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "LAB_PREFIX must match [a-z][a-z0-9]{0,7}, got '$P'"
[[ "$D" = /* && "$D" != / ]] || die "LAB_DIR must be an absolute path other than /, got '$D'"
[[ "$TMO" =~ ^[0-9]+$ ]] && [ "$TMO" -ge 5 ] && [ "$TMO" -le 300 ] || die "LAB_TIMEOUT must be 5..300"
[[ "$EDITS" =~ ^[0-9]+$ ]] && [ "$EDITS" -ge 1 ] && [ "$EDITS" -le 1000 ] || die "LAB_EDITS must be 1..1000"
[[ "$LOOP_PORT" =~ ^[0-9]+$ ]] && [ "$LOOP_PORT" -ge 1024 ] && [ "$LOOP_PORT" -le 65000 ] || die "LAB_LOOP_PORT must be 1024..65000"

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

ns_of() { echo "$P-$1"; }                 # a1 -> psr-a1, rl -> psr-rl, sa -> psr-sa
host_dir() { echo "$D/hosts/$1"; }
store_of() { echo "$D/stores/$1"; }
bridge_of() { case $1 in a*|c*) echo "$P-sa" ;; b*) echo "$P-sb" ;; *) die "no bridge for $1" ;; esac; }
addr_of() {
  case $1 in
    a1) echo "$SA.11" ;; a2) echo "$SA.12" ;; c1) echo "$SA.21" ;;
    b1) echo "$SB.11" ;; b2) echo "$SB.12" ;; *) die "no address for $1" ;;
  esac
}
relay_addr_of() { case $1 in a*|c*) echo "$RELAY_A" ;; b*) echo "$RELAY_B" ;; esac; }

lab_namespaces() {  # every namespace of this lab that exists now
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${P}-(sa|sb|rl|a1|a2|b1|b2|c1)$" || true
}


# run_in NS RUNDIR HOSTNAME CMD... : exec CMD inside NS with a private mount+UTS namespace whose /run is
# RUNDIR (so libdns_sd finds that host's dbus/avahi). Every step execs, so CMD keeps this PID; if
# LAB_PIDFILE is set the final PID is written there. RUNDIR "-" = no private /run (plain netns).
run_in() {
  local ns=$1 rundir=$2 hn=$3; shift 3
  if [ "$rundir" = - ]; then
    exec ip netns exec "$ns" sh -c '[ -z "${LAB_PIDFILE:-}" ] || { echo $$ > "$LAB_PIDFILE"; unset LAB_PIDFILE; }
                                   exec "$@"' lab-run "$@"
  fi
  exec ip netns exec "$ns" unshare --mount --uts --propagation private \
    sh -c 'mount --bind "$1" /run && hostname "$2" || exit 125
           [ -z "${LAB_PIDFILE:-}" ] || { echo $$ > "$LAB_PIDFILE"; unset LAB_PIDFILE; }
           shift 2; exec "$@"' lab-run "$rundir" "$hn" "$@"
}

# spawn NAME DIR NS RUNDIR HOSTNAME CMD... : start CMD detached inside NS (setsid; stdin from
# $LAB_STDIN or /dev/null; stdout DIR/NAME.out, stderr DIR/NAME.log) and record its PID in DIR/NAME.pid.
spawn() {
  local name=$1 dir=$2 ns=$3 rundir=$4 hn=$5; shift 5
  mkdir -p "$dir"
  rm -f "$dir/$name.pid"
  LAB_PIDFILE="$dir/$name.pid" setsid bash -c "$(declare -f run_in close_inherited_fds); close_inherited_fds; run_in \"\$@\"" \
    lab-start "$ns" "$rundir" "$hn" "$@" <"${LAB_STDIN:-/dev/null}" >"$dir/$name.out" 2>"$dir/$name.log" &
  wait_for "$TMO" test -s "$dir/$name.pid" || die "$name in $ns did not start (see $dir/$name.log)"
}
pid_of() { cat "$1/$2.pid" 2>/dev/null || true; }

# PIDs of this lab's root-namespace processes (the office step's nodes, the latency driver), only while
# their command line still names the state dir (a recycled PID is never killed).
root_pids() {
  local p
  [ -f "$D/pids.root" ] || return 0
  while read -r p; do
    [ -n "$p" ] && pid_alive "$p" && tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -qF "$D/" && echo "$p"
  done < "$D/pids.root"
  return 0
}

# ---------------------------------------------------------------------------------------------- down
teardown() {
  local nss ns p apps=() daemons=() f
  nss=$(lab_namespaces)
  # the office step's processes in the root namespace
  # shellcheck disable=SC2046
  stop_pids "root-namespace processes" $(root_pids)
  for f in "$D"/hosts/*/avahi.pid "$D"/hosts/*/dbus.pid; do [ -f "$f" ] && daemons+=("$(cat "$f")"); done
  for ns in $nss; do
    for p in $(ip netns pids "$ns" 2>/dev/null || true); do
      [[ " ${daemons[*]} " == *" $p "* ]] || apps+=("$p")
    done
  done
  stop_pids "lab processes" "${apps[@]}"
  stop_pids "avahi/dbus daemons" "${daemons[@]}"
  for ns in $nss; do
    p=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
    [ -z "$p" ] || { log "WARNING: pids still in $ns: $p; killing"; stop_pids "$ns leftovers" $p; }
    ip netns del "$ns" 2>/dev/null || log "WARNING: could not delete namespace $ns"
  done
  # undo the /run/netns bind mount that the first 'ip netns add' makes, if we caused it and it is now empty
  if [ "$(cat "$D/netns-mount" 2>/dev/null)" = ours ] && mountpoint -q /run/netns 2>/dev/null && [ -z "$(ls -A /run/netns)" ]; then
    umount /run/netns 2>/dev/null && rmdir /run/netns 2>/dev/null || true
  fi
  [ -z "$(lab_namespaces)" ] || { log "namespaces left: $(lab_namespaces | tr '\n' ' ')"; return 1; }
}

remove_state() {
  if [ -e "$D/$MARKER" ]; then rm -rf "$D"; elif [ -e "$D" ]; then log "leaving $D alone (no $MARKER in it)"; fi
}

cmd_down() {
  [ "$(id -u)" = 0 ] || die "must run as root"
  teardown || die "teardown incomplete"
  remove_state
  log "down: done"
}

# ------------------------------------------------------------------------------------------- build
build_lab() {
  local h ns br hd
  if mountpoint -q /run/netns 2>/dev/null; then echo pre > "$D/netns-mount"; else echo ours > "$D/netns-mount"; fi
  for br in sa sb; do
    ns=$(ns_of "$br")
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip -n "$ns" link add br0 type bridge
    ip -n "$ns" link set br0 type bridge mcast_snooping 0   # flood multicast (mDNS); no querier in the lab
    ip -n "$ns" link set br0 up
  done
  for h in $ALL_HOSTS; do
    ns=$(ns_of "$h"); br=$(bridge_of "$h"); hd=$(host_dir "$h")
    mkdir -p "$hd/run/dbus"
    ip netns add "$ns"
    # veth created directly between the two lab namespaces: never visible in the root namespace
    ip -n "$br" link add "$h" type veth peer name "$IFN" netns "$ns"
    ip -n "$br" link set "$h" master br0
    ip -n "$br" link set "$h" up
    ip -n "$ns" link set lo up
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    ip -n "$ns" addr add "$(addr_of "$h")/24" dev "$IFN"
    ip -n "$ns" link set "$IFN" multicast on up
  done
  # the relay host: one leg on each bridge, no forwarding between them
  ns=$(ns_of rl)
  mkdir -p "$D/relay"
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
  ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=0 net.ipv4.conf.all.forwarding=0 net.ipv4.conf.default.forwarding=0
  ip -n "$P-sa" link add rl type veth peer name laba netns "$ns"
  ip -n "$P-sb" link add rl type veth peer name labb netns "$ns"
  for br in sa sb; do ip -n "$P-$br" link set rl master br0; ip -n "$P-$br" link set rl up; done
  ip -n "$ns" addr add "$RELAY_A/24" dev laba
  ip -n "$ns" addr add "$RELAY_B/24" dev labb
  ip -n "$ns" link set laba up
  ip -n "$ns" link set labb up
  assert_isolated "$ns" "lo|laba|labb"
  [ "$(ip netns exec "$ns" sysctl -n net.ipv4.ip_forward)" = 0 ] || die "relay host forwards IPv4 - refusing"

  # per-host dbus-daemon + avahi-daemon in the site hosts (not c1, not the relay host)
  for h in $SITE_HOSTS; do
    hd=$(host_dir "$h"); ns=$(ns_of "$h")
    write_avahi_conf "$h" "$hd/avahi-daemon.conf"
    write_dbus_conf "$hd/dbus.conf"
    assert_isolated "$ns" "lo|$IFN"
    spawn dbus "$hd" "$ns" "$hd/run" "$h" dbus-daemon --config-file="$hd/dbus.conf" --nofork --nopidfile
  done
  for h in $SITE_HOSTS; do
    hd=$(host_dir "$h")
    wait_for "$TMO" test -S "$hd/run/dbus/system_bus_socket" || { tail -5 "$hd/dbus.log" >&2; die "$h: dbus did not come up"; }
  done
  for h in $SITE_HOSTS; do
    hd=$(host_dir "$h"); ns=$(ns_of "$h")
    assert_isolated "$ns" "lo|$IFN"
    assert_safe_avahi_conf "$hd/avahi-daemon.conf"
    spawn avahi "$hd" "$ns" "$hd/run" "$h" avahi-daemon -f "$hd/avahi-daemon.conf" --no-drop-root --no-chroot --no-rlimits
  done
  for h in $SITE_HOSTS; do
    hd=$(host_dir "$h")
    wait_for "$TMO" grep -q 'Server startup complete' "$hd/avahi.log" || { tail -5 "$hd/avahi.log" >&2; die "$h: avahi did not come up"; }
    pid_alive "$(pid_of "$hd" avahi)" || { tail -5 "$hd/avahi.log" >&2; die "$h: avahi exited"; }
  done
}

# ------------------------------------------------------------------------------------------ checks
CHECK_NAMES=(); CHECK_RESULTS=(); CHECK_DETAILS=()
record() {  # record NAME PASS|FAIL|INFO DETAIL
  CHECK_NAMES+=("$1"); CHECK_RESULTS+=("$2"); CHECK_DETAILS+=("$3")
  say "[$2] $1 - $3"
}

ps_in() {  # ps_in HOST ARGS... : run the lab's peersync copy inside HOST's namespace (no network use but relays add)
  local h=$1; shift
  ip netns exec "$(ns_of "$h")" "$BIN" "$@"
}
digest_of() {  # digest_of STOREDIR
  "$BIN" status --store "$1" --json 2>/dev/null | sed -n 's/^  "digest" : "\([0-9a-f]*\)".*/\1/p'
}
role_of() { "$BIN" status --store "$1" --json 2>/dev/null | sed -n 's/^  "role" : "\([a-z]*\)".*/\1/p'; }
has_peer() {  # has_peer STOREDIR NAME : the running node lists NAME as a directly connected peer
  "$BIN" status --store "$1" 2>/dev/null | grep -Eq "^  peer    $2 "
}
relay_connected() { "$BIN" status --store "$1" 2>/dev/null | grep -Eq "^  relay   .*: connected"; }
relay_settled() {  # connected, no counters pending, no blobs refused, no WITHHELD line
  local out; out=$("$BIN" status --store "$1" 2>/dev/null) || return 1
  echo "$out" | grep -Eq "^  relay   .*: connected, .*, 0 counters pending$" && ! echo "$out" | grep -q "WITHHELD"
}
has_location() { "$BIN" location list --store "$1" 2>/dev/null | grep -qF "$2"; }
all_have_location() { local s m=$1; shift; for s in "$@"; do has_location "$(store_of "$s")" "$m" || return 1; done; }
digests_equal() {  # digests_equal HOST... : every store's digest is the same (and not empty)
  local h d first=""
  for h in "$@"; do
    d=$(digest_of "$(store_of "$h")")
    [ -n "$d" ] || return 1
    [ -z "$first" ] && first=$d
    [ "$d" = "$first" ] || return 1
  done
}
none_joining() { local h; for h in "$@"; do [ "$(role_of "$(store_of "$h")")" != joining ] || return 1; done; }
node_up() { [ -s "$1/node.json" ]; }

# the three processes with the most CPU time over the last second (outside and inside the lab)
cpu_ticks() {  # "PID TICKS" for every process, sorted (comm may hold spaces: fields after its ')')
  awk '{ l = $0; sub(/^.*\) /, "", l); split(l, f, " "); n = FILENAME; gsub(/[^0-9]/, "", n); print n, f[12] + f[13] }' \
    /proc/[0-9]*/stat 2>/dev/null | LC_ALL=C sort
}
busy_now() {
  local a b
  a=$(cpu_ticks); sleep 1; b=$(cpu_ticks)
  LC_ALL=C join <(echo "$a") <(echo "$b") | awk -v hz="$(getconf CLK_TCK)" '$3 > $2 {printf "%s %d\n", $1, ($3 - $2) * 100 / hz}' \
    | sort -k2 -nr | head -3 | while read -r pid pct; do
        printf '%s(%s) %s%%, ' "$(tr -d '\n' < "/proc/$pid/comm" 2>/dev/null || echo gone)" "$pid" "$pct"
      done | sed 's/, $//'
}

port_free() { ! ss -ltnH "sport = :$1" 2>/dev/null | grep -q .; }

# ------------------------------------------------------------------------------ step 1: the office
# In the root namespace, on 127.0.0.1 only, without discovery: create, invite, join, sync once.
office() {
  local h i p pids=() port
  for i in 0 1 2 3 4 5; do port_free $((LOOP_PORT + i)) || die "loopback port $((LOOP_PORT + i)) is in use (set LAB_LOOP_PORT)"; done
  mkdir -p "$D/stores" "$D/office"
  "$BIN" init --store "$(store_of a1)" --name a1 > "$D/office/a1.init" 2>&1 || die "init a1 failed: $(cat "$D/office/a1.init")"
  for h in a2 b1 b2; do
    "$BIN" invite --store "$(store_of a1)" > "$D/office/$h.code" 2>"$D/office/$h.err" || die "invite for $h failed: $(cat "$D/office/$h.err")"
    "$BIN" join --store "$(store_of "$h")" --name "$h" "$(cat "$D/office/$h.code")" > "$D/office/$h.join" 2>&1 \
      || die "join $h failed: $(cat "$D/office/$h.join")"
  done
  "$BIN" init --store "$(store_of c1)" --name c1 > "$D/office/c1.init" 2>&1 || die "init c1 failed"
  "$BIN" invite --store "$(store_of c1)" > "$D/office/c2.code" 2>"$D/office/c2.err" || die "invite for c2 failed"
  "$BIN" join --store "$(store_of c2)" --name c2 "$(cat "$D/office/c2.code")" > "$D/office/c2.join" 2>&1 || die "join c2 failed"

  # the team: everyone dials a1 (the inviter); the control pair: c2 dials c1 (insecure, like later)
  port=$LOOP_PORT
  for h in a1 a2 b1 b2; do
    if [ "$h" = a1 ]; then set -- ; else set -- --peer "127.0.0.1:$LOOP_PORT"; fi
    "$BIN" run --store "$(store_of "$h")" --listen "127.0.0.1:$port" --no-discovery --log-level warning "$@" \
      </dev/null >"$D/office/$h.run.log" 2>&1 &
    pids+=($!); echo $! >> "$D/pids.root"; port=$((port + 1))
  done
  "$BIN" run --store "$(store_of c1)" --listen "127.0.0.1:$port" --no-discovery --insecure --log-level warning \
    </dev/null >"$D/office/c1.run.log" 2>&1 &
  pids+=($!); echo $! >> "$D/pids.root"
  "$BIN" run --store "$(store_of c2)" --listen "127.0.0.1:$((port + 1))" --peer "127.0.0.1:$port" --no-discovery --insecure \
    --log-level warning </dev/null >"$D/office/c2.run.log" 2>&1 &
  pids+=($!); echo $! >> "$D/pids.root"

  wait_for "$TMO" none_joining a2 b1 b2 c2 || die "office: a join did not complete within ${TMO}s (logs in $D/office)"
  wait_for "$TMO" digests_equal a1 a2 b1 b2 || die "office: the team's digests did not converge within ${TMO}s"
  wait_for "$TMO" digests_equal c1 c2 || die "office: the control pair's digests did not converge within ${TMO}s"
  for p in "${pids[@]}"; do pid_alive "$p" || die "office: a peersync run exited early (logs in $D/office)"; done
  stop_pids "office nodes" "${pids[@]}"
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}

# ------------------------------------------------------------------------------ nodes in the lab
start_site_node() {  # start_site_node HOST
  local h=$1 hd; hd=$(host_dir "$h")
  assert_isolated "$(ns_of "$h")" "lo|$IFN"
  AVAHI_COMPAT_NOWARN=1 spawn node "$hd" "$(ns_of "$h")" "$hd/run" "$h" \
    "$BIN" run --store "$(store_of "$h")" --listen "0.0.0.0:$NODE_PORT" --relay "$(relay_addr_of "$h"):$RELAY_PORT" \
    --log-level "$LOG_LEVEL" --commands
}

# latency H_FROM H_TO : EDITS edits through H_FROM's --commands input; each timed (monotonic clock) until
# H_TO's --commands output reports the change. Prints per-edit lines to a file, the summary on stdout.
measure_latency() {
  local from=$1 to=$2 pid
  # in the background (tracked like the office nodes, so 'down' stops it), without this script's FIFO
  # writer (fd 7): with a1 gone, its writes must fail rather than fill a pipe nobody reads
  python3 - "$(host_dir "$from")/node.in" "$(host_dir "$to")/node.out" "$(host_dir "$from")/node.out" "$EDITS" "$TMO" \
    "$D/latency-$from-$to.txt" > "$D/latency-$from-$to.summary" 7>&- 8>&- 9>&- <<'PY' &
import math, os, sys, time, uuid
fifo, out_to, out_from, n, tmo, report = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
w = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)   # fails at once (ENXIO) if the node is gone
r = open(out_to, "rb"); r.seek(0, os.SEEK_END)
buf = b""; lat = []; lost = 0
with open(report, "w") as rep:
    for i in range(n):
        rid = str(uuid.uuid4()).upper()
        line = f"put {rid} symbol=L{i} title=latency_edit_{i} durationSeconds={3600 + i}\n".encode()
        t0 = time.monotonic_ns()
        os.write(w, line)
        deadline = t0 + int(tmo * 1e9); seen = None
        while seen is None and time.monotonic_ns() < deadline:   # bounded by time
            chunk = r.read()
            if chunk:
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for l in lines:
                    if l.startswith(b"changed ") and rid.encode() in l:
                        seen = time.monotonic_ns()
            else:
                time.sleep(0.0005)
        if seen is None:
            lost += 1; rep.write(f"edit {i} {rid} not seen within {tmo:.0f}s\n")
            if lost >= 3: break   # the path is broken: no point waiting for the rest
        else:
            ms = (seen - t0) / 1e6; lat.append(ms); rep.write(f"edit {i} {rid} {ms:.1f} ms\n")
        time.sleep(0.2)
os.close(w)
if not lat:
    print(f"n=0 lost={lost}"); sys.exit(1)
s = sorted(lat)
rank = lambda q: s[max(0, math.ceil(q * len(s)) - 1)]
print(f"n={len(s)} lost={lost} p50={rank(0.5):.1f} p99={rank(0.99):.1f} min={s[0]:.1f} max={s[-1]:.1f} mean={sum(s)/len(s):.1f}")
sys.exit(1 if lost else 0)
PY
  pid=$!
  echo "$pid" >> "$D/pids.root"
  wait "$pid"
}

# -------------------------------------------------------------------------------------------- run
cmd_run() {
  local t_start h rd code i marker_a marker_b marker_c lat digest_a load_start t0 t1 failed=0 relay_pid tcpdump_pid
  [ "$(id -u)" = 0 ] || die "must run as root"
  for c in ip unshare setsid mount ss dbus-daemon avahi-daemon python3; do need "$c"; done
  command -v tcpdump >/dev/null 2>&1 || die "tcpdump is missing: install it with 'apt-get install -y tcpdump' (Scripts/setup.sh installs it too)"
  [ -x "$SRC_BIN" ] || die "no peersync binary at $SRC_BIN: build it first (swift build) or set PEERSYNC_BIN"
  [ -z "$(lab_namespaces)" ] || die "namespaces of this lab exist already: run '$0 down' first"
  if [ -e "$D" ]; then
    [ -e "$D/$MARKER" ] || [ -z "$(ls -A "$D")" ] || die "$D exists and is not this lab's state dir - refusing"
    [ -z "$(root_pids)" ] || die "processes of a previous run are alive: run '$0 down' first"
    rm -rf "$D"   # a previous run's kept state
  fi
  mkdir -p "$D/bin"
  touch "$D/$MARKER"
  t_start=$(now_ms); T_START=$t_start
  load_start=$(cut -d' ' -f1-3 /proc/loadavg)
  # Only the main shell tears down: a subshell ($(...)) that sees the signal or exits just leaves.
  # A trap runs with the redirections of the command it interrupts (wait_for's >/dev/null), so the
  # handlers first return to the script's own stdout/stderr, kept as fds 8 and 9.
  exec 8>&1 9>&2
  trap 'rc=$?; [ "$BASHPID" = $$ ] || exit $rc; trap - EXIT INT TERM; on_exit $rc' EXIT
  trap '[ "$BASHPID" = $$ ] || exit 130; exec 1>&8 2>&9; log "interrupted"; exit 130' INT TERM

  cp "$SRC_BIN" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
  "$BIN" relay --help >/dev/null 2>&1 || die "the copied binary ($SRC_BIN) does not run or has no 'relay' command (mid-rebuild?)"
  say "peersync copied from $SRC_BIN ($(stat -c %y "$SRC_BIN" | cut -d. -f1)); load average $load_start"

  say "step 1: the office (root namespace, 127.0.0.1 only, no discovery): a1 creates the group, a2 b1 b2 join; control pair c1 c2"
  t0=$(now_ms); office; t1=$(now_ms)
  say "  joined and converged in $((t1 - t0)) ms; office nodes stopped"

  say "building the lab: sites A ($SA.0/24) and B ($SB.0/24), relay host ($RELAY_A, $RELAY_B)"
  t0=$(now_ms); build_lab; t1=$(now_ms)
  say "  lab up in $((t1 - t0)) ms"
  if ip netns exec "$(ns_of a1)" ip route get "$(addr_of b1)" >/dev/null 2>&1 || ip netns exec "$(ns_of b2)" ip route get "$(addr_of a2)" >/dev/null 2>&1; then
    record "isolation" FAIL "a site host has a route to the other site"
  else
    record "isolation" PASS "no route a1->b1 / b2->a2; relay ip_forward=$(ip netns exec "$(ns_of rl)" sysctl -n net.ipv4.ip_forward)"
  fi

  # step 4 comes first: the capture runs before the relay exists and before any data is written
  rd="$D/relay"
  assert_isolated "$(ns_of rl)" "lo|laba|labb"
  spawn tcpdump "$rd" "$(ns_of rl)" - rl tcpdump -i any -n -U -s 0 -Z root -w "$rd/capture.pcap"
  tcpdump_pid=$(pid_of "$rd" tcpdump)
  wait_for "$TMO" grep -q 'listening on' "$rd/tcpdump.log" || { cat "$rd/tcpdump.log" >&2; die "tcpdump did not start"; }

  say "step 2: relay on the relay host; a1 enrols it from site A ($RELAY_A:$RELAY_PORT)"
  spawn relay "$rd" "$(ns_of rl)" - rl "$BIN" relay --store "$rd/store" --listen "0.0.0.0:$RELAY_PORT" --log-level "$LOG_LEVEL"
  relay_pid=$(pid_of "$rd" relay)
  wait_for "$TMO" grep -q 'peersync relays add' "$rd/relay.out" || { cat "$rd/relay.log" >&2; die "the relay did not print its code"; }
  code=$(grep 'peersync relays add' "$rd/relay.out" | awk '{print $NF}')
  [[ "$code" == PSL-* ]] || die "unexpected relay code line: $(grep 'peersync relays add' "$rd/relay.out")"
  [ "$code" = "$("$BIN" relay code --store "$rd/store" 2>/dev/null)" ] || log "note: 'relay code' prints another code than the running relay"
  if ps_in a1 relays add --store "$(store_of a1)" "$RELAY_A:$RELAY_PORT" "$code" > "$D/relays-add.out" 2>"$D/relays-add.log"; then
    record "enrol relay" PASS "a1 (in site A): $(head -1 "$D/relays-add.out")"
  else
    record "enrol relay" FAIL "$(tail -3 "$D/relays-add.log" | tr '\n' ' ')"; die "relays add failed"
  fi

  say "step 3: a1 a2 (site A) and b1 b2 (site B) run with DNS-SD discovery and --relay"
  mkfifo "$(host_dir a1)/node.in"
  exec 7<>"$(host_dir a1)/node.in"     # held open: a1's --commands input never sees EOF while we run
  LAB_STDIN="$(host_dir a1)/node.in" start_site_node a1
  for h in a2 b1 b2; do start_site_node "$h"; done
  for h in $SITE_HOSTS; do
    wait_for "$TMO" node_up "$(store_of "$h")" || { tail -5 "$(host_dir "$h")/node.log" >&2; die "$h: node did not start"; }
  done

  # (a) discovery within each site, and every node on the relay
  t0=$(now_ms)
  if wait_for "$TMO" has_peer "$(store_of a1)" a2 && wait_for "$TMO" has_peer "$(store_of a2)" a1; then
    record "(a) site A discovery" PASS "a1 and a2 list each other as direct peers ($(( $(now_ms) - t0 )) ms)"
  else record "(a) site A discovery" FAIL "a1/a2 do not list each other as peers within ${TMO}s"; fi
  t0=$(now_ms)
  if wait_for "$TMO" has_peer "$(store_of b1)" b2 && wait_for "$TMO" has_peer "$(store_of b2)" b1; then
    record "(a) site B discovery" PASS "b1 and b2 list each other as direct peers ($(( $(now_ms) - t0 )) ms)"
  else record "(a) site B discovery" FAIL "b1/b2 do not list each other as peers within ${TMO}s"; fi
  if has_peer "$(store_of a1)" 'b[12]' || has_peer "$(store_of b1)" 'a[12]'; then
    record "(a) no cross-site peers" FAIL "a node lists a peer of the other site"
  else record "(a) no cross-site peers" PASS "no a* <-> b* direct session"; fi
  local not_connected=""
  for h in $SITE_HOSTS; do wait_for "$TMO" relay_connected "$(store_of "$h")" || not_connected+="$h "; done
  if [ -z "$not_connected" ]; then record "(a) relay sessions" PASS "a1 a2 b1 b2 connected to the relay"
  else record "(a) relay sessions" FAIL "not connected: $not_connected"; fi

  # (b) markers across the relay, then convergence
  marker_a="relaylab-marker-$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
  marker_b="relaylab-marker-$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
  t0=$(now_ms)
  ps_in a1 location add --store "$(store_of a1)" --name "$marker_a" --address "$marker_a-street" > /dev/null
  if wait_for "$TMO" all_have_location "$marker_a" b1 b2; then
    record "(b) a1 -> b1,b2" PASS "$marker_a visible on b1 and b2 after $(( $(now_ms) - t0 )) ms"
  else record "(b) a1 -> b1,b2" FAIL "$marker_a not on b1/b2 within ${TMO}s"; fi
  t0=$(now_ms)
  ps_in b2 location add --store "$(store_of b2)" --name "$marker_b" --address "$marker_b-street" > /dev/null
  if wait_for "$TMO" all_have_location "$marker_b" a1; then
    record "(b) b2 -> a1" PASS "$marker_b visible on a1 after $(( $(now_ms) - t0 )) ms"
  else record "(b) b2 -> a1" FAIL "$marker_b not on a1 within ${TMO}s"; fi
  t0=$(now_ms)
  if wait_for "$TMO" digests_equal $SITE_HOSTS; then
    digest_a=$(digest_of "$(store_of a1)")
    record "(b) convergence" PASS "a1 a2 b1 b2 digests equal ($digest_a) within $(( $(now_ms) - t0 )) ms"
  else
    record "(b) convergence" FAIL "digests differ after ${TMO}s: $(for h in $SITE_HOSTS; do printf '%s=%s ' "$h" "$(digest_of "$(store_of "$h")")"; done)"
  fi

  # every node's view of the relay once converged: connected, nothing pending, withheld or refused
  local bad="" st
  for h in $SITE_HOSTS; do
    if ! wait_for "$TMO" relay_settled "$(store_of "$h")"; then
      st=$("$BIN" status --store "$(store_of "$h")" 2>/dev/null | grep -E '^  (relay|WITHHELD) ' | tr '\n' ' ' || true)
      bad+="$h: ${st:-no relay line}; "
    fi
  done
  if [ -z "$bad" ]; then record "(b) relay state on devices" PASS "each node: relay connected, 0 counters pending, nothing withheld or refused"
  else record "(b) relay state on devices" FAIL "$bad"; fi

  # (c) latency a1 -> b1 (a benchmark figure)
  say "(c) timing $EDITS edits a1 -> b1 (monotonic clock; a1's --commands input, b1's --commands output)"
  say "  load average $(cut -d' ' -f1-3 /proc/loadavg); busiest processes now: $(busy_now)"
  if measure_latency a1 b1; then
    record "(c) latency a1 -> b1" INFO "$(cat "$D/latency-a1-b1.summary") ms (nearest rank: p99 = max below 100 edits)"
    say "  samples (ms, in order): $(awk '{print $4}' "$D/latency-a1-b1.txt" | tr '\n' ' ')"
  else
    record "(c) latency a1 -> b1" FAIL "$(cat "$D/latency-a1-b1.summary" 2>/dev/null || echo no result) (details: $D/latency-a1-b1.txt)"
  fi
  # the same over the direct session in site A, for comparison (a figure only)
  if measure_latency a1 a2; then
    record "(c) latency a1 -> a2, direct" INFO "$(cat "$D/latency-a1-a2.summary") ms (same site: direct session, for comparison)"
  else
    record "(c) latency a1 -> a2, direct" INFO "no figure: $(cat "$D/latency-a1-a2.summary" 2>/dev/null || echo no result)"
  fi

  # (e) control group: plaintext on the wire, through the relay host's site A leg
  say "(e) control: insecure pair c1 (site A) -> c2 (relay host $RELAY_A:$CONTROL_PORT)"
  marker_c="control-marker-$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
  assert_isolated "$(ns_of c1)" "lo|$IFN"
  assert_isolated "$(ns_of rl)" "lo|laba|labb"
  spawn node "$rd/c2" "$(ns_of rl)" - rl "$BIN" run --store "$(store_of c2)" --listen "$RELAY_A:$CONTROL_PORT" \
    --insecure --no-discovery --log-level "$LOG_LEVEL"
  spawn node "$(host_dir c1)" "$(ns_of c1)" - c1 "$BIN" run --store "$(store_of c1)" --listen "0.0.0.0:$CONTROL_PORT" \
    --insecure --no-discovery --peer "$RELAY_A:$CONTROL_PORT" --log-level "$LOG_LEVEL"
  local ctl=""
  if wait_for "$TMO" has_peer "$(store_of c1)" c2; then
    t0=$(now_ms)
    ps_in c1 location add --store "$(store_of c1)" --name "$marker_c" --address "$marker_c-street" > /dev/null
    if wait_for "$TMO" all_have_location "$marker_c" c2; then ctl="c1 -> c2 took $(( $(now_ms) - t0 )) ms"
    else log "control marker did not reach c2 within ${TMO}s"; ctl="did not reach c2"; fi
  else
    log "control: c1 did not connect to c2 within ${TMO}s"
  fi
  sleep 1   # let the last segments reach the capture file (tcpdump -U writes each packet)

  # stop the capture (and the relay, so its files are final) before looking into them; the relay
  # deletes relay.json when it stops, so keep its last copy
  cp "$rd/store/relay.json" "$rd/relay.json.last" 2>/dev/null || true
  for h in $SITE_HOSTS; do "$BIN" status --store "$(store_of "$h")" > "$D/status-$h.txt" 2>&1 || true; done
  stop_pids "tcpdump" "$tcpdump_pid"
  # the devices first (graceful: their logs end without "relay closed the connection"), then the relay
  stop_pids "lab nodes" $(for h in $ALL_HOSTS; do pid_of "$(host_dir "$h")" node; done) "$(pid_of "$rd/c2" node)"
  stop_pids "relay" "$relay_pid"

  # (d) no marker in the capture or the relay's files; the capture did see relay traffic
  local pkts relay_json leaks="" m f
  pkts=$(tcpdump -r "$rd/capture.pcap" -nn "tcp port $RELAY_PORT" 2>/dev/null | wc -l)
  relay_json=$(tr -d '\n ' < "$rd/relay.json.last" 2>/dev/null || true)
  for m in "$marker_a" "$marker_b" "${marker_a#relaylab-marker-}" "${marker_b#relaylab-marker-}"; do
    grep -aqF "$m" "$rd/capture.pcap" && leaks+="capture:$m "
    for f in "$rd"/store/* "$rd"/relay.json.last "$rd"/relay.out "$rd"/relay.log; do
      [ -e "$f" ] && grep -aqF "$m" "$f" && leaks+="$(basename "$f"):$m "
    done
  done
  if [ "$pkts" -lt 10 ]; then
    record "(d) capture sees relay traffic" FAIL "only $pkts packets on port $RELAY_PORT in the capture"
  else
    record "(d) capture sees relay traffic" PASS "$pkts packets on port $RELAY_PORT ($(stat -c %s "$rd/capture.pcap") bytes captured)"
  fi
  if [[ "$relay_json" =~ \"groups\":1[,}] ]] && [[ "$relay_json" =~ \"blobs\":([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -ge 1 ]; then
    record "(d) relay stored blobs" PASS "relay.json: $relay_json"
  else
    record "(d) relay stored blobs" FAIL "expected 1 group and some blobs; relay.json: ${relay_json:-missing}"
  fi
  if [ -z "$leaks" ]; then
    record "(d) no marker at the relay" PASS "no marker in capture.pcap, relay.json, relay's log or store ($(cd "$rd/store" && ls | tr '\n' ' '))"
  else
    record "(d) no marker at the relay" FAIL "found: $leaks"
  fi
  # (e) the control marker is in the capture
  if grep -aqF "$marker_c" "$rd/capture.pcap"; then
    record "(e) control marker in capture" PASS "$marker_c found in plaintext ($ctl)"
  else
    record "(e) control marker in capture" FAIL "$marker_c not found in the capture (${ctl:-c1 never connected to c2})"
  fi

  # what the product logged above info (a figure: expected ones are filtered out)
  local warn
  warn=$(grep -HE ' (warning|error|critical) ' "$D"/office/*.log "$D"/hosts/*/node.log "$rd"/relay.log "$rd"/c2/node.log 2>/dev/null \
    | grep -v 'INSECURE mode' | sed -E "s|^$D/||; s|/node.log:|:|; s|\.run\.log:| (office):|; s|^[^:]*relay.log:|relay:|; s|[0-9T:+-]{24} ||" \
    | sed -E 's/(replica|peer\.id|peer\.address)=[^ ]* //g' | cut -c1-400 | sort | uniq -c | sort -nr || true)
  if [ -z "$warn" ]; then record "product warnings" INFO "none logged (besides INSECURE mode for the control pair)"
  else record "product warnings" INFO "$(echo "$warn" | wc -l) distinct; see below"; fi

  summary "$t_start" "$load_start"
  [ -z "$warn" ] || { echo "product warnings and errors (count, log: message):"; echo "$warn"; echo; }
  for i in "${!CHECK_RESULTS[@]}"; do [ "${CHECK_RESULTS[$i]}" != FAIL ] || failed=1; done
  [ "$failed" = 0 ]
}

summary() {
  local t_start=$1 load_start=$2 i
  echo
  echo "relay lab summary ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(( ($(now_ms) - t_start) / 1000 )) s so far, load average at start $load_start, now $(cut -d' ' -f1-3 /proc/loadavg))"
  printf '%-32s %-6s %s\n' CHECK RESULT DETAIL
  printf '%-32s %-6s %s\n' -------------------------------- ------ ------
  for i in "${!CHECK_NAMES[@]}"; do
    printf '%-32s %-6s %s\n' "${CHECK_NAMES[$i]}" "${CHECK_RESULTS[$i]}" "${CHECK_DETAILS[$i]}"
  done
  echo
}

on_exit() {
  local rc=$1
  exec 1>&8 2>&9
  exec 7>&-   # a1's command input: EOF (the node keeps running until it is stopped)
  say "tearing down"
  teardown || rc=1
  if [ "$rc" = 0 ] && [ "${LAB_KEEP:-0}" != 1 ]; then
    remove_state
    say "PASS: every check passed (run took $(( ($(now_ms) - T_START) / 1000 )) s)"
  elif [ "$rc" = 0 ]; then
    say "PASS: every check passed in $(( ($(now_ms) - T_START) / 1000 )) s (state kept in $D; '$0 down' removes it)"
  else
    say "FAIL (exit $rc): state kept in $D (logs, stores, capture); '$0 down' removes it"
  fi
  exit "$rc"
}

case "${1:-}" in
  run) cmd_run ;;
  down) cmd_down ;;
  *) sed -n '2,15p' "$0"; exit 2 ;;
esac
