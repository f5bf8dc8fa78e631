# netns-common.sh - helpers shared by netlab.sh and relay-lab.sh (sourced, never run).
#
# The sourcing script defines die, log and lab_namespaces, and sets IFN (the lab interface name), TMO (seconds for
# every wait) before sourcing. Nothing here starts a daemon or touches an interface: the
# scripts' own code does, after their safety checks.

need() { command -v "$1" >/dev/null 2>&1 || die "missing command: $1"; }

# wait_for SECONDS CMD... : poll CMD every 0.1 s until it succeeds or SECONDS elapse (returns 1 then)
wait_for() {
  local limit=$1; shift
  local end=$(( $(date +%s%N) + limit * 1000000000 ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s%N)" -lt "$end" ] || return 1
    sleep 0.1
  done
}

pid_alive() { [ -n "${1:-}" ] && [ -d "/proc/$1" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }
none_alive() { local p; for p in "$@"; do pid_alive "$p" && return 1; done; return 0; }

assert_safe_avahi_conf() {
  local f=$1
  grep -qx "allow-interfaces=$IFN" "$f" && grep -qx 'use-ipv6=no' "$f" && grep -qx 'enable-wide-area=no' "$f" \
    || die "$f lacks allow-interfaces=$IFN / use-ipv6=no / enable-wide-area=no - refusing"
}

write_avahi_conf() {  # $1=host name  $2=file
  cat > "$2" <<EOF
[server]
host-name=$1
domain-name=local
use-ipv4=yes
use-ipv6=no
allow-interfaces=$IFN
enable-dbus=yes
ratelimit-interval-usec=1000000
ratelimit-burst=1000

[wide-area]
enable-wide-area=no

[publish]
publish-hinfo=no
publish-workstation=no
publish-aaaa-on-ipv4=no
publish-a-on-ipv6=no

[reflector]
enable-reflector=no

[rlimits]
EOF
}

# A system bus for one lab host: runs as root inside the host, listens in the host's private /run,
# has no service directories (so nothing is ever bus-activated) and takes avahi's policy file.
write_dbus_conf() {  # $1=file
  cat > "$1" <<'EOF'
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=/run/dbus/system_bus_socket</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Properties"/>
  </policy>
  <includedir>/usr/share/dbus-1/system.d</includedir>
</busconfig>
EOF
}

# close_inherited_fds : close every descriptor above 2 in this shell. Daemons must not keep the
# caller's pipes or sockets open: a caller waiting for EOF, or Foundation.Process on Linux (which
# detects a child's exit by a socket it passes down), would otherwise wait for the daemon's exit.
close_inherited_fds() {
  local fd
  for fd in /proc/$BASHPID/fd/*; do
    fd=${fd##*/}
    [ "$fd" -gt 2 ] 2>/dev/null && eval "exec $fd>&-" 2>/dev/null || true
  done
}

# stop_pids LABEL PID... : SIGTERM all, wait up to TMO, then SIGKILL the rest and wait again (bounded)
stop_pids() {
  local what=$1; shift
  local live=() p
  for p in "$@"; do pid_alive "$p" && live+=("$p"); done
  [ ${#live[@]} -gt 0 ] || return 0
  kill -TERM "${live[@]}" 2>/dev/null || true
  if ! wait_for "$TMO" none_alive "${live[@]}"; then
    log "$what: pids $(for p in "${live[@]}"; do pid_alive "$p" && printf '%s ' "$p"; done)ignored SIGTERM; sending SIGKILL"
    kill -KILL "${live[@]}" 2>/dev/null || true
    wait_for 5 none_alive "${live[@]}" || log "WARNING: $what: some pids survived SIGKILL"
  fi
}

# assert_isolated NS [ALLOWED] : refuse to run anything in NS unless it is a namespace of this lab
# (the sourcing script's lab_namespaces), not the root or current network namespace, without
# uplink-like interfaces, and with only interfaces matching ALLOWED (an extended regex of names;
# default lo|$IFN).
assert_isolated() {
  local ns=$1 allowed=${2:-"lo|$IFN"} ns_ino self_ino pid1_ino links
  lab_namespaces | grep -qx "$ns" || die "$ns is not a namespace of this lab - refusing"
  ns_ino=$(ip netns exec "$ns" stat -L -c %i /proc/self/ns/net)
  self_ino=$(stat -L -c %i /proc/$$/ns/net)
  pid1_ino=$(stat -L -c %i /proc/1/ns/net 2>/dev/null || echo unreadable)
  # 4026531833 (0xEFFFFFF9) is the kernel's fixed inode number of the initial network namespace;
  # it is checked as well because /proc/1/ns may be unreadable in sandboxes.
  [ -n "$ns_ino" ] && [ "$ns_ino" != "$self_ino" ] && [ "$ns_ino" != "$pid1_ino" ] && [ "$ns_ino" != 4026531833 ] \
    || die "$ns is the root/current network namespace - refusing"
  links=$(ip -n "$ns" -o link show | awk -F': ' '{print $2}' | sed 's/@.*//')
  if echo "$links" | grep -Eq '^(eth|ens|enp|eno|wl)'; then
    die "$ns contains an uplink-like interface - refusing to start processes there"
  fi
  if echo "$links" | grep -Evqx "$allowed"; then
    die "$ns has interfaces other than $allowed ($(echo "$links" | tr '\n' ' ')) - refusing"
  fi
}
