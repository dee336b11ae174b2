#!/bin/bash
# DHCP benchmark: perfdhcp (Kea's load generator) against our server, dnsmasq and
# kea-dhcp4, one after another in the same run, over a veth pair between two
# private network namespaces (nothing is routed to the host; 198.18.0.0/16 is
# the RFC 2544 benchmarking range). Method: perfdhcp acts as a relay (giaddr
# 198.18.0.2, port 67 both ways), ACKs per second over the period, server CPU
# time from /proc/<pid>/stat.
#
# usage: tests/bench/dhcp.sh [RATES] [DURATION_S] [CLIENTS] [SERVERS]
#   RATES    comma-separated offered DORA/s          (default 1000,2500,4000)
#   SERVERS  comma-separated: ours,dnsmasq,kea-mt,kea-st (default: the first three;
#            kea-st is kea-dhcp4 single-threaded)
# env:
#   SCENARIO=rate       (default) fixed-rate runs; the summary names the
#                       highest rate of each server with under 1 % loss
#   SCENARIO=avalanche  CLIENTS clients start at once (perfdhcp --scenario
#                       avalanche, a cluster-wide power-on); RATES is ignored
#                       and DURATION_S is the deadline
#   PRELOAD=N           before each run the server is given N leases of
#                       other clients (an avalanche of N clients with another
#                       MAC base; dnsmasq: its lease file written directly, as
#                       it cannot lease 10,000 clients in a bounded time)
#   BUILD=release|debug (default release), KEEP=1 keeps the work folder.
# Prints one CSV line per run:
#   server,scenario,rate,dur,clients,preloaded,acks_per_s,do_sent,ra_recv,dora_loss_pct,took_s,leases,dup_ips,srv_cpu_s,cpu_ms_per_dora
# `leases` counts the distinct clients holding a lease in the server's own
# lease database after the run and `dup_ips` the addresses held by two
# clients (must be 0). Every server writes its leases to disk (ours: fsync
# before each ACK, group commit; dnsmasq: its lease file; kea: memfile,
# persist=true).
set -euo pipefail

# `cargo xtask bench --smoke` (MPROV_BENCH_SMOKE=1): a seconds-long run of all
# three servers with a debug build, only to prove the benchmark still works.
# Both scenarios run, the avalanche onto preloaded leases.
if [ "${MPROV_BENCH_SMOKE:-0}" = 1 ] && [ -z "${SCENARIO:-}" ]; then
  SCENARIO=rate bash "$0" "$@"
  SCENARIO=avalanche PRELOAD=1 exec bash "$0" "$@"
fi
if [ "${MPROV_BENCH_SMOKE:-0}" = 1 ]; then
  RATES=${1:-200}; DUR=${2:-2}; CLIENTS=${3:-500}; SERVERS=${4:-ours,dnsmasq,kea-mt}
  [ "$SCENARIO" = avalanche ] && DUR=${2:-10}
  PRELOAD=${PRELOAD:-0}; [ "$PRELOAD" = 0 ] || PRELOAD=200
  BUILD=${BUILD:-debug}
else
  RATES=${1:-1000,2500,4000}; DUR=${2:-10}; CLIENTS=${3:-10000}; SERVERS=${4:-ours,dnsmasq,kea-mt}
fi
BUILD=${BUILD:-release}
SCENARIO=${SCENARIO:-rate}; PRELOAD=${PRELOAD:-0}
case $SCENARIO in rate|avalanche) ;; *) echo "SCENARIO must be rate or avalanche" >&2; exit 2 ;; esac
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
cat > "$W/kea-mt.json" <<EOF
{ "Dhcp4": {
    "interfaces-config": { "interfaces": [ "$SDEV" ], "dhcp-socket-type": "raw" },
    "lease-database": { "type": "memfile", "persist": true, "name": "$W/kea-leases4.csv", "lfc-interval": 0 },
    "multi-threading": { "enable-multi-threading": true, "thread-pool-size": 2, "packet-queue-size": 64 },
    "valid-lifetime": 43200, "renew-timer": 21600, "rebind-timer": 37800,
    "authoritative": true,
    "subnet4": [ { "id": 1, "subnet": "198.18.0.0/16", "pools": [ { "pool": "198.18.1.0 - 198.18.255.254" } ] } ],
    "loggers": [ { "name": "kea-dhcp4", "output_options": [ { "output": "$W/kea.log" } ], "severity": "WARN" } ] } }
EOF
sed 's/"enable-multi-threading": true/"enable-multi-threading": false/' "$W/kea-mt.json" >"$W/kea-st.json"

# Starts $1 in the server namespace; sets SPID; waits (bounded) until it listens on 67.
start() {
  rm -f "$W"/leases.log "$W"/kea-leases4.csv* "$W"/dnsmasq.leases
  case $1 in
    ours)    ip netns exec "$SRV" "$OURS" "$W/leases.log" "$W/boot.json" 198.18.0.1 0.0.0.0:67 >"$W/ours.log" 2>&1 & SPID=$! ;;
    dnsmasq) : >"$W/dnsmasq.leases"; [ "$PRELOAD" -gt 0 ] && dnsmasq_preload
             ip netns exec "$SRV" dnsmasq --keep-in-foreground --conf-file="$W/dnsmasq.conf" \
               --dhcp-leasefile="$W/dnsmasq.leases" --no-ping >>"$W/dnsmasq.out" 2>&1 & SPID=$! ;;
    kea-mt|kea-st)
             KEA_PIDFILE_DIR=$W KEA_LOCKFILE_DIR=$W ip netns exec "$SRV" kea-dhcp4 -c "$W/$1.json" >>"$W/kea.out" 2>&1 & SPID=$! ;;
    *) echo "unknown server $1" >&2; exit 2 ;;
  esac
  for _ in $(seq 100); do
    ip netns exec "$SRV" ss -Hlun 'sport = :67' | grep -q . && return 0
    kill -0 "$SPID" 2>/dev/null || { echo "$1 exited" >&2; return 1; }
    sleep 0.05
  done
  echo "$1 did not listen on port 67" >&2; return 1
}

# Distinct clients holding a lease and addresses held by two clients, read
# from the server's own lease database (its durable state, not its replies).
count_leases() {
  python3 - "$1" "$2" <<'PY'
import csv, sys, time, zlib
kind, path = sys.argv[1], sys.argv[2]
by_mac = {}
try:
    if kind == "ours":
        # 24-byte records: 0xD1, kind (1 bound, 2 free), MAC, IPv4, expiry, CRC-32.
        data = open(path, "rb").read()
        for off in range(0, len(data) - 23, 24):
            r = data[off:off + 24]
            if r[0] != 0xD1 or zlib.crc32(r[:20]) != int.from_bytes(r[20:24], "big"):
                break
            mac, ip = r[2:8].hex(), ".".join(map(str, r[8:12]))
            if r[1] == 1:
                by_mac[mac] = ip
            else:
                by_mac.pop(mac, None)
    elif kind.startswith("kea"):
        now, by_addr = time.time(), {}
        for row in csv.DictReader(open(path)):
            # memfile appends a row per change; the last row of an address wins.
            live = int(row["valid_lifetime"]) > 0 and int(row["expire"]) > now
            by_addr[row["address"]] = row["hwaddr"] if live else None
        by_mac = {m: a for a, m in by_addr.items() if m is not None}
    else:
        for line in open(path):
            f = line.split()
            if len(f) >= 3 and f[0] != "duid":
                by_mac[f[1]] = f[2]
except FileNotFoundError:
    pass
ips = list(by_mac.values())
print(len(by_mac), len(ips) - len(set(ips)))
PY
}
lease_db() {
  case $1 in ours) echo "$W/leases.log" ;; kea-*) echo "$W/kea-leases4.csv" ;; dnsmasq) echo "$W/dnsmasq.leases" ;; esac
}

# Gives the running server $1 PRELOAD leases of clients other than the
# measured ones (MAC base 00:0d:...; perfdhcp's default is 00:0c:...).
preload() {
  [ "$PRELOAD" -gt 0 ] || return 0
  if [ "$1" = dnsmasq ]; then
    return 0 # written before the start, see start()
  fi
  timeout 120 ip netns exec "$CLI" perfdhcp -4 -l "$CDEV" --scenario avalanche -R "$PRELOAD" \
    -b mac=00:0d:01:02:03:04 198.18.0.1 >"$W/preload-$1.txt" 2>&1 || true
}

# dnsmasq's lease file with PRELOAD leases, written before it starts.
dnsmasq_preload() {
  python3 - "$PRELOAD" "$W/dnsmasq.leases" <<'PY'
import sys, time
n, path = int(sys.argv[1]), sys.argv[2]
exp = int(time.time()) + 43200
with open(path, "w") as f:
    for i in range(n):
        f.write(f"{exp} 00:0d:01:{i >> 16 & 255:02x}:{i >> 8 & 255:02x}:{i & 255:02x} "
                f"198.18.{200 + (i >> 8)}.{i & 255} * *\n")
PY
}

echo "server,scenario,rate,dur,clients,preloaded,acks_per_s,do_sent,ra_recv,dora_loss_pct,took_s,leases,dup_ips,srv_cpu_s,cpu_ms_per_dora"
[ "$SCENARIO" = avalanche ] && RATES=0
declare -A BEST
for srv in ${SERVERS//,/ }; do
  BEST[$srv]=none
  for rate in ${RATES//,/ }; do
    start "$srv"
    preload "$srv"
    read -r pre _ < <(count_leases "$srv" "$(lease_db "$srv")")
    read -r ut0 st0 < <(awk '{print $14, $15}' "/proc/$SPID/stat")
    out=$W/perfdhcp-$srv-$rate.txt
    if [ "$SCENARIO" = avalanche ]; then
      timeout "$DUR" ip netns exec "$CLI" perfdhcp -4 -l "$CDEV" --scenario avalanche -R "$CLIENTS" \
        198.18.0.1 >"$out" 2>&1 || true
    else
      timeout $((DUR + 30)) ip netns exec "$CLI" perfdhcp -4 -l "$CDEV" -r "$rate" -R "$CLIENTS" -p "$DUR" \
        -W 1000000 198.18.0.1 >"$out" 2>&1 || true
    fi
    read -r ut st < <(awk '{print $14, $15}' "/proc/$SPID/stat")
    kill "$SPID"; wait "$SPID" 2>/dev/null || true; SPID=""
    read -r leases dups < <(count_leases "$srv" "$(lease_db "$srv")")
    line=$(awk -v srv="$srv" -v sc="$SCENARIO" -v rate="$rate" -v dur="$DUR" -v cl="$CLIENTS" -v pre="$pre" \
        -v ut="$((ut - ut0))" -v st="$((st - st0))" -v leases="$((leases - pre))" -v dups="$dups" '
      /Statistics for: DISCOVER-OFFER/ {s="do"} /Statistics for: REQUEST-ACK/ {s="ra"}
      /^sent packets:/ {sent[s]=$3} /^received packets:/ {recv[s]=$3}
      /^It took/ {n=split($3, t, ":"); took=(n==3) ? t[1]*3600+t[2]*60+t[3] : $3+0}
      END { cpu=(ut+st)/100; acks=recv["ra"]+0;
            loss = sent["do"]>0 ? 100*(sent["do"]-acks)/sent["do"] : 100;
            per = acks>0 ? 1000*cpu/acks : 0;
            if (sc == "avalanche") { rate = "-"; persec = took > 0 ? acks/took : 0; took = (took == "") ? "timeout" : sprintf("%.2f", took) }
            else { persec = acks/dur; took = "-" }
            printf "%s,%s,%s,%s,%s,%d,%.0f,%d,%d,%.2f,%s,%d,%d,%.2f,%.3f\n",
              srv, sc, rate, dur, cl, pre, persec, sent["do"], acks, loss, took, leases, dups, cpu, per }' "$out")
    echo "$line"
    loss=$(echo "$line" | cut -d, -f10)
    if [ "$SCENARIO" = rate ] && awk -v l="$loss" 'BEGIN{exit !(l < 1)}'; then BEST[$srv]=$rate; fi
  done
done
if [ "$SCENARIO" = rate ]; then
  for srv in ${SERVERS//,/ }; do
    echo "# $srv: highest offered rate with under 1 % loss: ${BEST[$srv]}"
  done
fi
