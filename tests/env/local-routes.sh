#!/usr/bin/env bash
# Keeps every address range the tests invent on this machine: each range gets an `unreachable` route in the
# root network namespace, so an address whose test host is gone (a stopped Ray head, a deleted Pod) fails at
# once with "no route to host" instead of following the default route off the machine. Live test hosts add
# more specific routes (a /24 on their veth), which still win.
#
#   local-routes.sh ensure    install the routes (idempotent; safe from several test processes at once)
#   local-routes.sh check     fail loudly unless every range has its unreachable route
#   local-routes.sh ranges    print the ranges, one a line
#
# The routes are never removed: they only ever catch traffic that must not leave, and removing them while any
# test host or sender could still exist would reopen the leak.
set -euo pipefail

# The one list of invented ranges. Everything a test or the demo makes up must fall inside one of these.
RANGES=(
  10.250.0.0/16 # test hosts: Ray heads in network namespaces (10.250.N.2), stand-in and fake-node Pod IPs
  10.96.0.0/16  # the test apiserver's Service ClusterIPs (--service-cluster-ip-range)
)

SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo

die() { echo "local-routes: $*" >&2; exit 1; }

# The machine's own addresses, gateways and nameservers must never fall inside a test range: an unreachable
# route there would cut the machine off (its nameserver is in 10/8 on some of our machines).
check_no_overlap() {
  command -v python3 >/dev/null || die "python3 is needed to check the ranges"
  local own
  own=$( { ip -o -4 addr show scope global | awk '{print $4}' | cut -d/ -f1
           ip -4 route show default | awk '{print $3}'
           awk '/^nameserver/ {print $2}' /etc/resolv.conf 2>/dev/null; } | grep -v '^10\.250\.' || true)
  python3 - "${RANGES[@]}" <<EOF || exit 1
import ipaddress, sys
own = """$own""".split()
for r in sys.argv[1:]:
    net = ipaddress.ip_network(r)
    for a in own:
        try:
            ip = ipaddress.ip_address(a)
        except ValueError:
            continue
        if ip.version == 4 and ip in net:
            sys.exit(f"local-routes: the test range {r} holds this machine's own address {a}; choose another range")
EOF
}

ensure() {
  if ! command -v ip >/dev/null; then
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq iproute2 >/dev/null
  fi
  check_no_overlap
  local r
  for r in "${RANGES[@]}"; do
    $SUDO ip route replace unreachable "$r" || die "could not install 'unreachable $r' (needs root or sudo)"
  done
  check
}

check() {
  command -v ip >/dev/null || die "'ip' (iproute2) is not installed, so no local route can be checked"
  local r missing=()
  for r in "${RANGES[@]}"; do
    ip route show exact "$r" type unreachable | grep . >/dev/null || missing+=("$r")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "local-routes: NO LOCAL ROUTE for ${missing[*]}: traffic to a gone test host would leave this machine." >&2
    echo "local-routes: run 'bash tests/env/local-routes.sh ensure' (as root) first." >&2
    exit 1
  fi
}

case "${1:-}" in
  ensure) ensure ;;
  check) check ;;
  ranges) printf '%s\n' "${RANGES[@]}" ;;
  *) echo "usage: $0 ensure | check | ranges" >&2; exit 2 ;;
esac
