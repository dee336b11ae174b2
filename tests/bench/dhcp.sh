#!/bin/bash
# DHCP benchmark: perfdhcp (Kea's load generator) against our server, dnsmasq and
# kea-dhcp4, one after another in the same run, over a veth pair between two
# private network namespaces (nothing is routed to the host; 198.18.0.0/16 is
# the RFC 2544 benchmarking range). Method as in
# ../shared/reference/baselines.md section 2: perfdhcp acts as a relay (giaddr
# 198.18.0.2, port 67 both ways), 10 s runs, ACKs per second over the period,
# server CPU time from /proc/<pid>/stat.
#
# usage: tests/bench/dhcp.sh [RATES] [DURATION_S] [CLIENTS] [SERVERS]
#   RATES    comma-separated offered DORA/s          (default 1000,2500,4000)
#   SERVERS  comma-separated: ours,dnsmasq,kea-mt    (default all three)
# env: BUILD=release|debug (default release), KEEP=1 keeps the work folder.
# Prints one CSV line per run:
#   server,rate,dur,clients,acks_per_s,do_sent,ra_recv,dora_loss_pct,srv_cpu_s,cpu_ms_per_dora
# Every server writes its leases to disk (ours: fsync before each ACK, group
# commit; dnsmasq: its lease file; kea: memfile, persist=true).
set -euo pipefail

# `cargo xtask bench --smoke` (MPROV_BENCH_SMOKE=1): a seconds-long run of all
# three servers with a debug build, only to prove the benchmark still works.
if [ "${MPROV_BENCH_SMOKE:-0}" = 1 ]; then
  RATES=${1:-200}; DUR=${2:-2}; CLIENTS=${3:-500}; SERVERS=${4:-ours,dnsmasq,kea-mt}
  BUILD=${BUILD:-debug}
else
  RATES=${1:-1000,2500,4000}; DUR=${2:-10}; CLIENTS=${3:-10000}; SERVERS=${4:-ours,dnsmasq,kea-mt}
fi
BUILD=${BUILD:-release}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)

[ "$(id -u)" = 0 ] || { echo "needs root (network namespaces)" >&2; exit 2; }
command -v perfdhcp >/dev/null || { echo "perfdhcp missing: apt-get install kea-admin" >&2; exit 2; }

if [ "$BUILD" = release ]; then
  cargo build --quiet --release -p mprov-dhcp --bin mprov-dhcp-testserver --manifest-path "$ROOT/Cargo.toml"
else
  cargo build --quiet -p mprov-dhcp --bin mprov-dhcp-testserver --manifest-path "$ROOT/Cargo.toml"
fi
TARGET=$(cargo metadata --format-version 1 --no-deps --manifest-path "$ROOT/Cargo.toml" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
OURS=$TARGET/$BUILD/mprov-dhcp-testserver

W=$(mktemp -d /var/tmp/mprov-dhcp-bench.XXXXXX)
SRV=mpbs-$$; CLI=mpbc-$$; SDEV=mpbs$$; CDEV=mpbc$$
SPID=""
cleanup() {
  [ -n "$SPID" ] && kill "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null || true
  ip netns del "$CLI" 2>/dev/null || true
  ip netns del "$SRV" 2>/dev/null || true
  [ "${KEEP:-0}" = 1 ] && echo "work folder: $W" >&2 || rm -rf "$W"
}
trap cleanup EXIT

ip netns add "$SRV"; ip netns add "$CLI"
ip link add "$SDEV" netns "$SRV" type veth peer name "$CDEV" netns "$CLI"
ip -n "$SRV" addr add 198.18.0.1/16 dev "$SDEV"; ip -n "$CLI" addr add 198.18.0.2/16 dev "$CDEV"
for n in "$SRV" "$CLI"; do ip -n "$n" link set lo up; done
ip -n "$SRV" link set "$SDEV" up; ip -n "$CLI" link set "$CDEV" up

cat > "$W/boot.json" <<EOF
{"revision": 1,
 "networks": [{"slug": "bench", "subnet": "198.18.0.0", "prefix": 16, "dhcp": true,
               "pool": ["198.18.1.0", "198.18.255.254"]}],
 "hosts": []}
EOF
cat > "$W/dnsmasq.conf" <<EOF
port=0
interface=$SDEV
bind-interfaces
except-interface=lo
dhcp-range=198.18.1.0,198.18.255.254,255.255.0.0,12h
dhcp-lease-max=100000
dhcp-authoritative
pid-file=$W/dnsmasq.pid
log-facility=$W/dnsmasq.log
quiet-dhcp
user=root
group=root
EOF
cat > "$W/kea.json" <<EOF
{ "Dhcp4": {
    "interfaces-config": { "interfaces": [ "$SDEV" ], "dhcp-socket-type": "raw" },
    "lease-database": { "type": "memfile", "persist": true, "name": "$W/kea-leases4.csv", "lfc-interval": 0 },
    "multi-threading": { "enable-multi-threading": true, "thread-pool-size": 2, "packet-queue-size": 64 },
    "valid-lifetime": 43200, "renew-timer": 21600, "rebind-timer": 37800,
    "authoritative": true,
    "subnet4": [ { "id": 1, "subnet": "198.18.0.0/16", "pools": [ { "pool": "198.18.1.0 - 198.18.255.254" } ] } ],
    "loggers": [ { "name": "kea-dhcp4", "output_options": [ { "output": "$W/kea.log" } ], "severity": "WARN" } ] } }
EOF

# Starts $1 in the server namespace; sets SPID; waits (bounded) until it listens on 67.
start() {
  rm -f "$W"/leases.log "$W"/kea-leases4.csv* "$W"/dnsmasq.leases
  case $1 in
    ours)    ip netns exec "$SRV" "$OURS" "$W/leases.log" "$W/boot.json" 198.18.0.1 0.0.0.0:67 >"$W/ours.log" 2>&1 & SPID=$! ;;
    dnsmasq) : >"$W/dnsmasq.leases"
             ip netns exec "$SRV" dnsmasq --keep-in-foreground --conf-file="$W/dnsmasq.conf" \
               --dhcp-leasefile="$W/dnsmasq.leases" --no-ping >>"$W/dnsmasq.out" 2>&1 & SPID=$! ;;
    kea-mt)  KEA_PIDFILE_DIR=$W KEA_LOCKFILE_DIR=$W ip netns exec "$SRV" kea-dhcp4 -c "$W/kea.json" >>"$W/kea.out" 2>&1 & SPID=$! ;;
    *) echo "unknown server $1" >&2; exit 2 ;;
  esac
  for _ in $(seq 100); do
    ip netns exec "$SRV" ss -Hlun 'sport = :67' | grep -q . && return 0
    kill -0 "$SPID" 2>/dev/null || { echo "$1 exited" >&2; return 1; }
    sleep 0.05
  done
  echo "$1 did not listen on port 67" >&2; return 1
}

echo "server,rate,dur,clients,acks_per_s,do_sent,ra_recv,dora_loss_pct,srv_cpu_s,cpu_ms_per_dora"
for srv in ${SERVERS//,/ }; do
  for rate in ${RATES//,/ }; do
    start "$srv"
    out=$W/perfdhcp-$srv-$rate.txt
    timeout $((DUR + 30)) ip netns exec "$CLI" perfdhcp -4 -l "$CDEV" -r "$rate" -R "$CLIENTS" -p "$DUR" -W 1000000 198.18.0.1 >"$out" 2>&1 || true
    read -r ut st < <(awk '{print $14, $15}' "/proc/$SPID/stat")
    kill "$SPID"; wait "$SPID" 2>/dev/null || true; SPID=""
    awk -v srv="$srv" -v rate="$rate" -v dur="$DUR" -v cl="$CLIENTS" -v ut="$ut" -v st="$st" '
      /Statistics for: DISCOVER-OFFER/ {s="do"} /Statistics for: REQUEST-ACK/ {s="ra"}
      /^sent packets:/ {sent[s]=$3} /^received packets:/ {recv[s]=$3}
      END { cpu=(ut+st)/100; acks=recv["ra"]+0;
            loss = sent["do"]>0 ? 100*(sent["do"]-acks)/sent["do"] : 100;
            per = acks>0 ? 1000*cpu/acks : 0;
            printf "%s,%s,%s,%s,%.0f,%d,%d,%.2f,%.2f,%.3f\n", srv, rate, dur, cl, acks/dur, sent["do"], acks, loss, cpu, per }' "$out"
  done
done
