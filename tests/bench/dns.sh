#!/usr/bin/env bash
# DNS benchmark: mprov-dns vs dnsmasq, side by side in one run, on loopback.
#
# Both servers serve the same 10,000 host names under cluster.test:
#   dnsmasq: an addn-hosts file, local=/cluster.test/ (its usual setup as
#            a cluster's authoritative DNS)
#   ours:    the same names as a BootConfig JSON, served by the
#            `serve_snapshot` example of boot/dns (release build)
# dnsperf (default settings: 1 client, 100 outstanding queries) cycles through
# A queries for all 10,000 names for SECONDS per run; runs are interleaved
# (dnsmasq, ours, dnsmasq, ours, ...). Reported per run: QPS, completed and
# lost queries, and the server's CPU time (utime+stime from /proc/PID/stat)
# per completed query.
#
# The runner uses a current-thread tokio runtime (see its doc comment).
#
# Results on the shared 2-vCPU VM (2026-11-30, `tests/bench/dns.sh 5 10`,
# medians; the absolute figures move by half with machine load, even within
# one invocation, so compare within a pair):
#   dnsmasq 2.90   87,240 QPS  4.8 us CPU/query  0 lost   (load1 5.3-5.9)
#   mprov-dns     152,990 QPS  2.8 us CPU/query  0 lost   (ahead in all 5 pairs)
# Steps (see tests/bench/RESULTS.md): before the wire-format fast path
#   (src/fast.rs) 129,177 vs 136,797 QPS, 6.2 vs 6.0 us (0.94x); with it but
#   one syscall each way per query 100,499 vs 58,195 QPS, 3.9 vs 4.9 us.
#   Before the exact-match table (everything through hickory's Catalog):
#   36,128 vs 67,382 QPS, 13.0 vs 5.6 us; multi-threaded runtime: 21 us.

# usage: tests/bench/dns.sh [RUNS (default 3)] [SECONDS (default 10)]
# needs: cargo, dnsperf, dnsmasq, dig, python3. Traffic stays on 127.0.0.1.
# Stops only the two servers it started, by PID.
set -euo pipefail

# `cargo xtask bench --smoke` (MPROV_BENCH_SMOKE=1): one short run with a
# debug build, only to prove the benchmark still works.
if [ "${MPROV_BENCH_SMOKE:-0}" = 1 ]; then
  RUNS=${1:-1}; SECS=${2:-2}; N=1000; PROFILE=debug
else
  RUNS=${1:-3}; SECS=${2:-10}; N=10000; PROFILE=release
fi
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d /tmp/mprov-dns-bench.XXXXXX)
DNSMASQ_PID=""
OURS_PID=""

cleanup() {
  for pid in $DNSMASQ_PID $OURS_PID; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT

echo "# building serve_snapshot ($PROFILE)" >&2
(cd "$ROOT" && cargo build --quiet --profile "${PROFILE/debug/dev}" -p mprov-dns --example serve_snapshot)
TARGET=$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
BIN=$TARGET/$PROFILE/examples/serve_snapshot

# The data: hosts file, BootConfig JSON, dnsperf query file, two free ports
# (command substitution waits for python to exit, closing its probe sockets).
PORTS=$(python3 - "$WORK" "$N" <<'EOF'
import json, socket, sys
work, n = sys.argv[1], int(sys.argv[2])
hosts, names = [], []
for i in range(1, n + 1):
    ip = f"10.0.{i // 256}.{i % 256}"
    name = f"n{i:05d}"
    hosts.append({"hostname": name, "ipv4": ip, "network": "prov"})
    names.append(f"{name}.cluster.test")
with open(f"{work}/hosts", "w") as f:
    for h, fq in zip(hosts, names):
        f.write(f"{h['ipv4']} {fq}\n")
with open(f"{work}/queries", "w") as f:
    for fq in names:
        f.write(f"{fq} A\n")
cfg = {"revision": 1,
       "networks": [{"slug": "prov", "subnet": "10.0.0.0", "prefix": 16,
                     "domain": "cluster.test", "dns": True}],
       "hosts": hosts}
with open(f"{work}/bootconfig.json", "w") as f:
    json.dump(cfg, f)
ports = []
socks = []
while len(ports) < 2:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("127.0.0.1", 0))
    p = u.getsockname()[1]
    t = socket.socket()
    try:
        t.bind(("127.0.0.1", p))
    except OSError:
        continue
    socks += [u, t]; ports.append(p)
print(*ports)
EOF
)
read -r P_DNSMASQ P_OURS <<<"$PORTS"

dnsmasq --keep-in-foreground --conf-file=/dev/null --port="$P_DNSMASQ" \
  --listen-address=127.0.0.1 --bind-interfaces --no-resolv --no-hosts \
  --addn-hosts="$WORK/hosts" --domain-needed --bogus-priv --local=/cluster.test/ \
  --cache-size=10000 --pid-file="$WORK/dnsmasq.pid" --user=root --group=root \
  --log-facility="$WORK/dnsmasq.log" &
DNSMASQ_PID=$!
"$BIN" "$WORK/bootconfig.json" "127.0.0.1:$P_OURS" >"$WORK/ours.log" 2>&1 &
OURS_PID=$!

# Bounded wait until both answer the last name.
for port in "$P_DNSMASQ" "$P_OURS"; do
  ok=""
  for _ in $(seq 1 100); do
    if dig @127.0.0.1 -p "$port" +short +tries=1 +time=1 "n$(printf %05d "$N").cluster.test" A | grep -qx "10.0.$((N / 256)).$((N % 256))"; then
      ok=1; break
    fi
    sleep 0.1
  done
  [ -n "$ok" ] || { echo "server on port $port did not answer" >&2; exit 1; }
done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
HZ=$(getconf CLK_TCK)

# Warm-up: one pass through the names each (bounded by -n 1 and -l 10).
dnsperf -s 127.0.0.1 -p "$P_DNSMASQ" -d "$WORK/queries" -n 1 -l 10 >/dev/null 2>&1 || true
dnsperf -s 127.0.0.1 -p "$P_OURS" -d "$WORK/queries" -n 1 -l 10 >/dev/null 2>&1 || true

{
echo "server,run,qps,completed,lost,avg_latency_ms,server_cpu_s,cpu_us_per_query,load1"
for run in $(seq 1 "$RUNS"); do
  for srv in dnsmasq ours; do
    if [ "$srv" = dnsmasq ]; then pid=$DNSMASQ_PID; port=$P_DNSMASQ; else pid=$OURS_PID; port=$P_OURS; fi
    load1=$(cut -d' ' -f1 /proc/loadavg)
    t0=$(cpu_ticks "$pid")
    out=$WORK/${srv}_run$run.txt
    timeout $((SECS + 15)) dnsperf -s 127.0.0.1 -p "$port" -d "$WORK/queries" -l "$SECS" >"$out" 2>&1
    t1=$(cpu_ticks "$pid")
    awk -v s="$srv" -v r="$run" -v ticks=$((t1 - t0)) -v hz="$HZ" -v l1="$load1" '
      /Queries completed:/ {c=$3} /Queries lost:/ {l=$3} /Queries per second:/ {q=$4}
      /Average Latency/ {a=$4*1000}
      END {cpu=ticks/hz; printf "%s,%d,%.0f,%s,%s,%.3f,%.2f,%.1f,%s\n", s, r, q, c, l, a, cpu, (c>0? cpu*1e6/c : 0), l1}' "$out"
  done
done
} | tee "$WORK/results.csv"

python3 - "$WORK/results.csv" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
print("\nmedian over runs:")
for srv in ("dnsmasq", "ours"):
    rs = [r for r in rows if r["server"] == srv]
    if not rs:
        continue
    qps = statistics.median(float(r["qps"]) for r in rs)
    cpu = statistics.median(float(r["cpu_us_per_query"]) for r in rs)
    lost = sum(int(r["lost"] or 0) for r in rs)
    print(f"  {srv:8s} {qps:9.0f} QPS  {cpu:6.1f} us CPU/query  lost {lost}  (n={len(rs)})")
EOF
echo "raw output: $WORK" >&2
