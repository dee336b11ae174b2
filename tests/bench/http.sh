#!/usr/bin/env bash
# HTTP benchmark: mprov-fileserver vs nginx, side by side in one run, on loopback.
#
# Both servers serve the same folder: one file of SIZE MiB of random bytes at
# /images/bench/1/big.bin (2 GiB for the full run; 64 MiB
# for --smoke).
#   nginx: sendfile on, access_log off, worker_processes auto (its fastest
#          setup for static files)
#   ours:  the `serve_dir` example of boot/fileserver (release build), admission
#          limit above the client count
# Each run starts 32 concurrent `curl -o /dev/null` downloads of the file and
# waits for all; runs are interleaved (nginx, ours, nginx, ours, ...). Reported
# per run: wall time, aggregate throughput, and the server's CPU time
# (utime+stime from /proc/PID/stat, summed over nginx's master and workers)
# per GB served; then the median throughput ratio ours/nginx (goal: >= 0.9).
# The clients (curl) share the 2 cores with the server, the same for both.
#
# usage: tests/bench/http.sh [--smoke] [RUNS (default 3, smoke 1)]
# needs: cargo, curl, nginx, python3. Traffic stays on 127.0.0.1.
# Stops only the two servers it started, by PID.
set -euo pipefail

SMOKE=${MPROV_BENCH_SMOKE:-0}
if [[ "${1:-}" == "--smoke" ]]; then
  SMOKE=1
  shift
fi
if [[ "$SMOKE" == 1 ]]; then
  SIZE_MIB=64
  RUNS=${1:-1}
else
  SIZE_MIB=2048
  RUNS=${1:-3}
fi
CLIENTS=32
MAX_TIME=600
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d /var/tmp/mprov-http-bench.XXXXXX)
NGINX_PID=""
OURS_PID=""

cleanup() {
  for pid in $OURS_PID $NGINX_PID; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT

PROFILE=release
[[ "$SMOKE" == 1 ]] && PROFILE=debug
echo "# building serve_dir ($PROFILE)" >&2
(cd "$ROOT" && cargo build --quiet --profile "${PROFILE/debug/dev}" -p mprov-fileserver --example serve_dir)
TARGET=$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
BIN=$TARGET/$PROFILE/examples/serve_dir

echo "# writing ${SIZE_MIB} MiB of random data" >&2
mkdir -p "$WORK/root/images/bench/1" "$WORK/nginx/logs"
# nginx workers run as an unprivileged user when started as root.
chmod -R a+rX "$WORK"
FILE=$WORK/root/images/bench/1/big.bin
head -c "$((SIZE_MIB * 1024 * 1024))" /dev/urandom > "$FILE"
SIZE=$(stat -c %s "$FILE")
chmod a+r "$FILE"
cat "$FILE" > /dev/null # page cache, for both servers alike

read -r P_NGINX P_OURS < <(python3 - <<'EOF'
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])
EOF
)

cat > "$WORK/nginx/nginx.conf" <<EOF
worker_processes auto;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/logs/error.log warn;
events { worker_connections 1024; }
http {
  sendfile on;
  tcp_nopush on;
  access_log off;
  client_body_temp_path $WORK/nginx/tmp_body;
  proxy_temp_path $WORK/nginx/tmp_proxy;
  fastcgi_temp_path $WORK/nginx/tmp_fastcgi;
  uwsgi_temp_path $WORK/nginx/tmp_uwsgi;
  scgi_temp_path $WORK/nginx/tmp_scgi;
  types { }
  default_type application/octet-stream;
  server {
    listen 127.0.0.1:$P_NGINX;
    root $WORK/root;
  }
}
EOF

nginx -e "$WORK/nginx/logs/error.log" -c "$WORK/nginx/nginx.conf" -p "$WORK/nginx/" &
NGINX_PID=$!
"$BIN" "$WORK/root" "$P_OURS" 1024 2> "$WORK/ours.log" &
OURS_PID=$!

# Bounded wait until both answer.
wait_up() {
  for _ in $(seq 1 100); do
    if curl -s -o /dev/null -I "http://127.0.0.1:$1/images/bench/1/big.bin"; then
      return 0
    fi
    sleep 0.1
  done
  echo "server on port $1 did not come up" >&2
  return 1
}
wait_up "$P_NGINX"
wait_up "$P_OURS"

# CPU ticks (utime+stime) of a process and its direct children.
cpu_ticks() {
  local total=0 pid
  for pid in "$1" $(ps -o pid= --ppid "$1" 2>/dev/null); do
    if [[ -r /proc/$pid/stat ]]; then
      # Fields after the ")" of comm: utime is field 14, stime 15 overall.
      total=$((total + $(sed 's/^.*) //' "/proc/$pid/stat" | awk '{print $12 + $13}')))
    fi
  done
  echo "$total"
}

HZ=$(getconf CLK_TCK)
RESULTS=$WORK/results
: > "$RESULTS"

run() { # name port pid
  local name=$1 port=$2 pid=$3 i t0 t1 c0 c1 ok pids=()
  c0=$(cpu_ticks "$pid")
  t0=$(date +%s.%N)
  for i in $(seq 1 "$CLIENTS"); do
    curl -s -o /dev/null --max-time "$MAX_TIME" -w '%{http_code} %{size_download}\n' \
      "http://127.0.0.1:$port/images/bench/1/big.bin" > "$WORK/$name.$i.out" &
    pids+=($!)
  done
  # Failures show up in the counts below.
  wait "${pids[@]}" || true
  t1=$(date +%s.%N)
  c1=$(cpu_ticks "$pid")
  ok=$(cat "$WORK/$name".*.out | grep -c "^200 $SIZE\$" || true)
  rm -f "$WORK/$name".*.out
  python3 - "$name" "$t0" "$t1" "$c0" "$c1" "$HZ" "$SIZE" "$CLIENTS" "$ok" >> "$RESULTS" <<'EOF'
import sys
name, t0, t1, c0, c1, hz, size, n, ok = sys.argv[1:]
secs = float(t1) - float(t0)
gb = int(size) * int(ok) / 1e9
cpu = (int(c1) - int(c0)) / int(hz)
print(f"{name} {secs:.2f} {gb / secs * 1000:.0f} {cpu / gb if gb else 0:.3f} {ok}/{n}")
EOF
  tail -n 1 "$RESULTS" >&2
}

echo "# name wall_s MB/s server_cpu_s_per_GB complete" >&2
for _ in $(seq 1 "$RUNS"); do
  run nginx "$P_NGINX" "$NGINX_PID"
  run ours "$P_OURS" "$OURS_PID"
done

python3 - "$RESULTS" "$SIZE_MIB" "$CLIENTS" <<'EOF'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
def med(name, col):
    return statistics.median(float(r[col]) for r in rows if r[0] == name)
failed = [r for r in rows if r[4].split("/")[0] != r[4].split("/")[1]]
print(f"HTTP: {sys.argv[3]} concurrent downloads of {sys.argv[2]} MiB, runs={len(rows)//2}")
for name in ("nginx", "ours"):
    print(f"  {name:5}: median {med(name, 2):.0f} MB/s, {med(name, 3):.3f} server CPU s/GB")
print(f"  throughput ratio ours/nginx: {med('ours', 2) / med('nginx', 2):.2f} (goal >= 0.9)")
print(f"  CPU per GB ratio ours/nginx: {med('ours', 3) / med('nginx', 3):.2f}")
if failed:
    print(f"  FAILED downloads: {failed}")
    sys.exit(1)
EOF
