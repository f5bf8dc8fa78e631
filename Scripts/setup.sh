#!/usr/bin/env bash
# Installs the Debian packages PeerSync needs, if any are missing. Safe to run again.
# Never starts a daemon: the avahi packages (for discovery tests) are installed with
# service start-up blocked, and the tests run avahi only inside their own network namespaces.
set -euo pipefail

packages=(libsqlite3-dev zlib1g-dev avahi-daemon libavahi-compat-libdnssd-dev dbus avahi-utils iproute2 nftables tcpdump)  # daemons never started: policy-rc.d below

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The doc-snippet check (Scripts/doc-snippets.py) needs a python3, from Debian if there is none.
command -v python3 > /dev/null || missing+=(python3)
[ ${#missing[@]} -eq 0 ] && exit 0

echo "setup: installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
# Block service start-up during the install (policy-rc.d), so no daemon starts on the real network.
policy=/usr/sbin/policy-rc.d
created_policy=no
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
  $sudo chmod +x "$policy"
  created_policy=yes
fi
trap '[ "$created_policy" = yes ] && $sudo rm -f "$policy"' EXIT
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
