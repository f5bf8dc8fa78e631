#!/usr/bin/env bash
# netlab.sh - PeerSync's N-host mDNS/DNS-SD lab, built from Linux network namespaces.
#
#   netlab.sh up N               build N hosts: netns + bridge + per-host dbus-daemon + avahi-daemon
#   netlab.sh down               stop every process in the lab, delete its namespaces, mounts and state dir
#                                (also cleans up after a failed or half-finished 'up')
#   netlab.sh exec HOST CMD...   run CMD inside HOST (h1..hN or 1..N) with that host's private /run, so
#                                libdns_sd / avahi-browse talk to that host's avahi-daemon (exec: same PID)
#   netlab.sh env HOST           print an "ip netns exec NS env DBUS_SYSTEM_BUS_ADDRESS=..." prefix
#   netlab.sh cut HOST           partition HOST (its bridge port goes down)
#   netlab.sh heal HOST          reconnect HOST (bridge port up) and clear its packet loss
#   netlab.sh loss HOST PCT      drop PCT% of frames to/from HOST at the bridge (nftables; no netem here)
#   netlab.sh stop-avahi HOST    stop HOST's avahi-daemon (SIGTERM: it sends goodbye packets)
#   netlab.sh start-avahi HOST   start HOST's avahi-daemon again and wait until it is up
#   netlab.sh status             hosts, addresses, daemon PIDs
#
# Environment: LAB_PREFIX (namespace prefix, default psl; [a-z][a-z0-9]{0,11}),
#              LAB_DIR (state dir, default /tmp/peersync-lab/$LAB_PREFIX), LAB_SUBNET (default 10.77.0),
#              LAB_TIMEOUT (seconds for every wait, default 15).
#
# Topology: namespace $P-br holds bridge br0; host K is namespace $P-hK with one veth "lab0"
# ($LAB_SUBNET.(10+K)/24) whose peer pK is a port of br0. IPv4 only (IPv6 disabled in the hosts).
#
# Safety: no interface is ever created in (or moved through) the root namespace: veth pairs are
# created straight between lab namespaces. dbus-daemon and avahi-daemon start only after checking
# that the target namespace is not the root/current one and holds no interface but lo and lab0;
# each host's avahi config also has allow-interfaces=lab0, use-ipv6=no, enable-wide-area=no, and
# each dbus-daemon has no service directories (no bus activation). Every wait is bounded.
set -euo pipefail

P=${LAB_PREFIX:-psl}
D=${LAB_DIR:-/tmp/peersync-lab/$P}
SUBNET=${LAB_SUBNET:-10.77.0}
TMO=${LAB_TIMEOUT:-15}
IFN=lab0
BR="${P}-br"
MARKER=.peersync-netlab

die() { echo "netlab.sh: $*" >&2; exit 1; }
log() { echo "netlab.sh: $*" >&2; }
# need, wait_for, pid_alive, none_alive, the avahi and dbus configurations, close_inherited_fds, stop_pids
. "$(dirname "${BASH_SOURCE[0]}")/netns-common.sh"

[[ "$P" =~ ^[a-z][a-z0-9]{0,11}$ ]] || die "LAB_PREFIX must match [a-z][a-z0-9]{0,11}, got '$P'"
[[ "$D" = /* && "$D" != / ]] || die "LAB_DIR must be an absolute path other than /, got '$D'"
[[ "$SUBNET" =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "LAB_SUBNET must look like 10.77.0"
[[ "$TMO" =~ ^[0-9]+$ ]] && [ "$TMO" -ge 1 ] && [ "$TMO" -le 300 ] || die "LAB_TIMEOUT must be 1..300"

host_index() {  # h3 | 3 -> 3
  local h=${1#h}
  [[ "$h" =~ ^[0-9]+$ ]] && [ "$h" -ge 1 ] || die "bad host '$1' (use h1..hN or 1..N)"
  echo "$h"
}
host_ns() { echo "${P}-h$(host_index "$1")"; }
host_dir() { echo "$D/h$(host_index "$1")"; }
require_host() {  # dies unless HOST exists in the running lab
  local i; i=$(host_index "$1")
  [ -e "$D/hosts" ] && [ "$i" -le "$(cat "$D/hosts")" ] && [ -d "$D/h$i/run" ] || die "no such host $1 (is the lab up?)"
}

lab_namespaces() {  # every namespace of this prefix that exists now
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${P}-(br|h[0-9]+)$" || true
}


# run_in NSNAME RUNDIR HOSTNAME CMD... : exec CMD inside NS with a private mount+UTS namespace whose /run
# is RUNDIR. Every step execs, so CMD keeps this PID; if LAB_PIDFILE is set the final PID is written there.
run_in() {
  local ns=$1 rundir=$2 hn=$3; shift 3
  exec ip netns exec "$ns" unshare --mount --uts --propagation private \
    sh -c 'mount --bind "$1" /run && hostname "$2" || exit 125
           [ -z "${LAB_PIDFILE:-}" ] || { echo $$ > "$LAB_PIDFILE"; unset LAB_PIDFILE; }
           shift 2; exec "$@"' lab-run "$rundir" "$hn" "$@"
}

# start_daemon NAME HOSTDIR NS HOSTNAME CMD... : start detached (setsid, stdin=/dev/null, no inherited
# descriptors), record PID
start_daemon() {
  local name=$1 hd=$2 ns=$3 hn=$4; shift 4
  rm -f "$hd/$name.pid"
  LAB_PIDFILE="$hd/$name.pid" setsid bash -c "$(declare -f run_in close_inherited_fds); close_inherited_fds; run_in \"\$@\"" \
    lab-start "$ns" "$hd/run" "$hn" "$@" </dev/null >"$hd/$name.log" 2>&1 &
  wait_for "$TMO" test -s "$hd/$name.pid" || die "$name in $ns did not start (see $hd/$name.log)"
}

start_avahi() {  # start_avahi INDEX
  local i=$1 ns="${P}-h$1" hd="$D/h$1"
  assert_isolated "$ns"
  assert_safe_avahi_conf "$hd/avahi-daemon.conf"
  start_daemon avahi "$hd" "$ns" "h$i" avahi-daemon -f "$hd/avahi-daemon.conf" --no-drop-root --no-chroot --no-rlimits  # inside host netns only, after assert_isolated
}

wait_avahi_up() {  # wait_avahi_up INDEX
  local hd="$D/h$1"
  wait_for "$TMO" grep -q 'Server startup complete' "$hd/avahi.log" \
    || { tail -5 "$hd/avahi.log" >&2; die "h$1: avahi did not come up"; }
  pid_alive "$(cat "$hd/avahi.pid")" || { tail -5 "$hd/avahi.log" >&2; die "h$1: avahi exited"; }
}

cmd_up() {
  local n=${1:-3} i ns hd addr
  [ "$(id -u)" = 0 ] || die "must run as root"
  for c in ip unshare setsid mount dbus-daemon avahi-daemon; do need "$c"; done
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 100 ] || die "N must be 1..100"
  [ -z "$(lab_namespaces)" ] || die "namespaces with prefix $P exist already; run '$0 down' first"
  if [ -e "$D" ]; then
    [ -e "$D/$MARKER" ] || [ -z "$(ls -A "$D")" ] || die "$D exists and is not a lab state dir - refusing"
    [ ! -e "$D/hosts" ] || die "lab already up (state in $D); run '$0 down' first"
  fi
  mkdir -p "$D"
  touch "$D/$MARKER"
  trap 'rc=$?; if [ $rc -ne 0 ]; then log "up failed (rc=$rc); tearing down"; cmd_down; fi' EXIT
  if mountpoint -q /run/netns 2>/dev/null; then echo pre > "$D/netns-mount"; else echo ours > "$D/netns-mount"; fi
  echo "$n" > "$D/hosts"

  ip netns add "$BR"
  ip -n "$BR" link set lo up
  ip -n "$BR" link add br0 type bridge
  ip -n "$BR" link set br0 type bridge mcast_snooping 0   # flood all multicast; no querier in the lab
  ip -n "$BR" link set br0 up

  for i in $(seq 1 "$n"); do
    ns="${P}-h$i"; hd="$D/h$i"; addr="$SUBNET.$((10 + i))"
    mkdir -p "$hd/run/dbus"
    ip netns add "$ns"
    # veth created directly between the two lab namespaces: never visible in the root namespace
    ip -n "$BR" link add "p$i" type veth peer name "$IFN" netns "$ns"
    ip -n "$BR" link set "p$i" master br0
    ip -n "$BR" link set "p$i" up
    ip -n "$ns" link set lo up
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1
    ip -n "$ns" addr add "$addr/24" dev "$IFN"
    ip -n "$ns" link set "$IFN" multicast on up
    echo "$addr" > "$hd/addr"
    write_avahi_conf "h$i" "$hd/avahi-daemon.conf"
    write_dbus_conf "$hd/dbus.conf"
  done

  for i in $(seq 1 "$n"); do
    ns="${P}-h$i"; hd="$D/h$i"
    assert_isolated "$ns"
    start_daemon dbus "$hd" "$ns" "h$i" dbus-daemon --config-file="$hd/dbus.conf" --nofork --nopidfile
  done
  for i in $(seq 1 "$n"); do
    hd="$D/h$i"
    wait_for "$TMO" test -S "$hd/run/dbus/system_bus_socket" || { tail -5 "$hd/dbus.log" >&2; die "h$i: dbus did not come up"; }
    pid_alive "$(cat "$hd/dbus.pid")" || { tail -5 "$hd/dbus.log" >&2; die "h$i: dbus exited"; }
  done
  for i in $(seq 1 "$n"); do start_avahi "$i"; done
  for i in $(seq 1 "$n"); do wait_avahi_up "$i"; done
  trap - EXIT
  log "up: $n hosts ($(for i in $(seq 1 "$n"); do printf 'h%s=%s ' "$i" "$(cat "$D/h$i/addr")"; done))"
}

cmd_down() {
  local nss ns p apps=() avahis=() dbuses=() f
  nss=$(lab_namespaces)
  for f in "$D"/h*/avahi.pid; do [ -f "$f" ] && avahis+=("$(cat "$f")"); done
  for f in "$D"/h*/dbus.pid; do [ -f "$f" ] && dbuses+=("$(cat "$f")"); done
  # every other process inside a lab namespace (probes, test apps, 'exec' leftovers)
  for ns in $nss; do
    for p in $(ip netns pids "$ns" 2>/dev/null || true); do
      [[ " ${avahis[*]} ${dbuses[*]} " == *" $p "* ]] || apps+=("$p")
    done
  done
  stop_pids "lab apps" "${apps[@]}"
  stop_pids "avahi-daemons" "${avahis[@]}"
  stop_pids "dbus-daemons" "${dbuses[@]}"
  for ns in $nss; do
    p=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
    [ -z "$p" ] || { log "WARNING: pids still in $ns: $p; killing"; stop_pids "$ns leftovers" $p; }
    ip netns del "$ns" 2>/dev/null || log "WARNING: could not delete namespace $ns"
  done
  # undo the /run/netns bind mount that the first 'ip netns add' makes, if we caused it and it is now empty
  if [ "$(cat "$D/netns-mount" 2>/dev/null)" = ours ] && mountpoint -q /run/netns 2>/dev/null && [ -z "$(ls -A /run/netns)" ]; then
    umount /run/netns 2>/dev/null && rmdir /run/netns 2>/dev/null || true
  fi
  if [ -e "$D/$MARKER" ]; then rm -rf "$D"; elif [ -e "$D" ]; then log "leaving $D alone (no $MARKER in it)"; fi
  [ -z "$(lab_namespaces)" ] || die "namespaces left: $(lab_namespaces | tr '\n' ' ')"
  log "down: done"
}

cmd_exec() {
  [ $# -ge 2 ] || die "usage: $0 exec HOST CMD..."
  local h=$1; shift
  require_host "$h"
  local ns hd
  ns=$(host_ns "$h"); hd=$(host_dir "$h")
  export LAB_HOST="h$(host_index "$h")" LAB_ADDR="$(cat "$hd/addr")"
  run_in "$ns" "$hd/run" "$LAB_HOST" "$@"
}

cmd_env() {
  [ $# -eq 1 ] || die "usage: $0 env HOST"
  require_host "$1"
  echo "ip netns exec $(host_ns "$1") env DBUS_SYSTEM_BUS_ADDRESS=unix:path=$(host_dir "$1")/run/dbus/system_bus_socket"
}

# Fault injection on the bridge side of a host's link (affects that host only, never the root namespace).
cmd_cut() { [ $# -eq 1 ] || die "usage: $0 cut HOST"; require_host "$1"; ip -n "$BR" link set "p$(host_index "$1")" down; }
cmd_heal() {
  [ $# -eq 1 ] || die "usage: $0 heal HOST"; require_host "$1"
  local i; i=$(host_index "$1")
  ip -n "$BR" link set "p$i" up
  ip netns exec "$BR" nft delete table bridge "lab_loss_$i" 2>/dev/null || true
}
cmd_loss() {
  [ $# -eq 2 ] || die "usage: $0 loss HOST PCT"; require_host "$1"
  local i pct=$2; i=$(host_index "$1")
  need nft; [[ "$pct" =~ ^[0-9]+$ ]] && [ "$pct" -le 100 ] || die "PCT must be 0..100"
  ip netns exec "$BR" nft delete table bridge "lab_loss_$i" 2>/dev/null || true
  ip netns exec "$BR" nft -f - <<EOF
table bridge lab_loss_$i {
  chain fw { type filter hook forward priority 0; policy accept;
    iifname "p$i" numgen random mod 100 < $pct drop
    oifname "p$i" numgen random mod 100 < $pct drop
  }
}
EOF
}

cmd_stop_avahi() {
  [ $# -eq 1 ] || die "usage: $0 stop-avahi HOST"; require_host "$1"
  local hd; hd=$(host_dir "$1")
  [ -f "$hd/avahi.pid" ] || { log "h${1#h}: avahi not running"; return 0; }
  stop_pids "h${1#h} avahi-daemon" "$(cat "$hd/avahi.pid")"
  rm -f "$hd/avahi.pid"
}

cmd_start_avahi() {
  [ $# -eq 1 ] || die "usage: $0 start-avahi HOST"; require_host "$1"
  local i hd; i=$(host_index "$1"); hd=$(host_dir "$1")
  if [ -f "$hd/avahi.pid" ] && pid_alive "$(cat "$hd/avahi.pid")"; then die "h$i: avahi already runs"; fi
  pid_alive "$(cat "$hd/dbus.pid" 2>/dev/null)" || die "h$i: dbus-daemon is not running"
  start_avahi "$i"
  wait_avahi_up "$i"
}

cmd_status() {
  [ -e "$D/hosts" ] || { echo "lab $P is down"; return 0; }
  local n i hd; n=$(cat "$D/hosts")
  for i in $(seq 1 "$n"); do
    hd="$D/h$i"
    printf 'h%s ns=%s addr=%s dbus=%s avahi=%s link=%s\n' "$i" "${P}-h$i" "$(cat "$hd/addr")" \
      "$(pid_alive "$(cat "$hd/dbus.pid" 2>/dev/null)" && cat "$hd/dbus.pid" || echo dead)" \
      "$(pid_alive "$(cat "$hd/avahi.pid" 2>/dev/null)" && cat "$hd/avahi.pid" || echo dead)" \
      "$(ip -n "$BR" -o link show "p$i" 2>/dev/null | grep -q 'state UP' && echo up || echo down)"
  done
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  exec) shift; cmd_exec "$@" ;;
  env) shift; cmd_env "$@" ;;
  status) cmd_status ;;
  cut) shift; cmd_cut "$@" ;;
  heal) shift; cmd_heal "$@" ;;
  loss) shift; cmd_loss "$@" ;;
  stop-avahi) shift; cmd_stop_avahi "$@" ;;
  start-avahi) shift; cmd_start_avahi "$@" ;;
  *) sed -n '2,17p' "$0"; exit 2 ;;
esac
