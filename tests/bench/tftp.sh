#!/usr/bin/env bash
# TFTP benchmark: mprov-tftp vs tftp-hpa's in.tftpd on loopback, same run.
#
# A 30 MiB random file is fetched with atftp (blksize 1468, windowsize 1, 16
# and 64, tsize 0) from each server, RUNS times per setting, interleaved (one
# fetch from ours, one from tftp-hpa, and again), so that load from other
# work on the machine falls on both alike. Reported per setting: mean
# throughput and the server's CPU time per transfer, from /proc/<pid>/stat. Ours is one process: utime+stime of it. in.tftpd forks a
# child per transfer and ignores SIGCHLD (SA_NOCLDWAIT), so no cutime ever
# accumulates: a sampler reads each child's utime+stime every 5 ms and keeps
# the last value seen, which undercounts by at most the last 5 ms of each
# child (the sampler's own CPU slightly slows both sides on 2 cores).
#
# Note: tftp-hpa 5.2 does not implement windowsize (RFC 7440), so its OACK
# leaves it out and atftp falls back to lock-step: its rows at windowsize 16
# and 64 show what a client gets from it when asking for a window.
#
# Needs: atftp, tftpd-hpa (apt-get install tftpd-hpa; its service does not
# need to run), cargo. Bounded: every fetch runs under `timeout`.
#
# Usage: tests/bench/tftp.sh [RUNS]   (default 3)
set -euo pipefail

# `cargo xtask bench --smoke` (MPROV_BENCH_SMOKE=1): one run of a small file
# with a debug build, only to prove the benchmark still works.
if [ "${MPROV_BENCH_SMOKE:-0}" = 1 ]; then
  RUNS=${1:-1}; SMOKE_SIZE=2; PROFILE=debug
else
  RUNS=${1:-3}; SMOKE_SIZE=""; PROFILE=release
fi
SIZE_MIB=${SMOKE_SIZE:-30}
FETCH_TIMEOUT=120
HERE=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d /tmp/tftp-bench.XXXXXX)
PIDS=()

cleanup() {
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

command -v atftp >/dev/null || { echo "atftp is missing (apt-get install atftp)" >&2; exit 1; }
IN_TFTPD=$(command -v in.tftpd || echo /usr/sbin/in.tftpd)
[ -x "$IN_TFTPD" ] || { echo "in.tftpd is missing (apt-get install tftpd-hpa)" >&2; exit 1; }

(cd "$HERE" && cargo build --quiet --profile "${PROFILE/debug/dev}" -p mprov-tftp --example serve)
TARGET=$(cd "$HERE" && cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
SERVE="$TARGET/$PROFILE/examples/serve"

mkdir -p "$WORK/root"
chmod 755 "$WORK" "$WORK/root"
head -c $((SIZE_MIB * 1024 * 1024)) /dev/urandom >"$WORK/root/file.bin"
chmod 644 "$WORK/root/file.bin"
TICK=$(getconf CLK_TCK)

# Waits (bounded polling) until a file is non-empty.
wait_for() {
    for _ in $(seq 100); do
        [ -s "$1" ] && return 0
        sleep 0.05
    done
    echo "timed out waiting for $1" >&2
    return 1
}

# CPU ticks (utime+stime) of one process.
cpu_ticks() {
    # Fields after the ")" that ends comm: utime is field 14, stime 15.
    local rest
    rest=$(sed 's/^.*) //' "/proc/$1/stat")
    # shellcheck disable=SC2086
    set -- $rest
    echo $(( ${12} + ${13} ))
}

# Samples the children of $1 until $2 exists, then writes the sum of their
# last-seen utime+stime (ticks) to $3.
sample_children() {
    python3 - "$1" "$2" "$3" <<'PY'
import os, sys, time
parent, stop, out = sys.argv[1], sys.argv[2], sys.argv[3]
last = {}
while not os.path.exists(stop):
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if rest[1] == parent:
            last[pid] = int(rest[11]) + int(rest[12])
    time.sleep(0.005)
with open(out, "w") as f:
    f.write(str(sum(last.values())))
PY
}

# fetch NAME PORT WINDOW: one atftp download, checked byte for byte.
fetch() {
    local name=$1 port=$2 window=$3
    rm -f "$WORK/out.bin"
    timeout "$FETCH_TIMEOUT" atftp --option "blksize 1468" --option "windowsize $window" \
        --option "tsize 0" -g -r file.bin -l "$WORK/out.bin" 127.0.0.1 "$port" >/dev/null 2>&1 ||
        { echo "$name windowsize $window: atftp failed" >&2; return 1; }
    cmp -s "$WORK/out.bin" "$WORK/root/file.bin" ||
        { echo "$name windowsize $window: bytes differ" >&2; return 1; }
}

now() { date +%s.%N; }

# row NAME WINDOW SECONDS TICKS: one table row (means over RUNS).
row() {
    awk -v n="$1" -v w="$2" -v secs="$3" -v t="$4" -v r="$RUNS" -v mib="$SIZE_MIB" -v hz="$TICK" 'BEGIN {
        printf "| %-12s | %10d | %12.1f | %18.1f |\n", n, w, mib / (secs / r), 1000 * t / hz / r
    }'
}

# bench: for each window, RUNS rounds of one fetch from ours then one from
# tftp-hpa, so both see the same machine load (others may be compiling).
# Ours: its own CPU time around each fetch; tftp-hpa: its per-transfer
# child, sampled.
bench() {
    for window in 1 16 64; do
        local ours_s=0 hpa_s=0 ours_t=0 hpa_t=0 t0 t1 before after sampler
        for _ in $(seq "$RUNS"); do
            before=$(cpu_ticks "$OURS_PID")
            t0=$(now)
            fetch mprov-tftp "$OURS_PORT" "$window"
            t1=$(now)
            after=$(cpu_ticks "$OURS_PID")
            ours_s=$(awk -v a="$ours_s" -v s="$t0" -v e="$t1" 'BEGIN { print a + e - s }')
            ours_t=$((ours_t + after - before))

            rm -f "$WORK/stop" "$WORK/ticks"
            sample_children "$HPA_PID" "$WORK/stop" "$WORK/ticks" &
            sampler=$!
            t0=$(now)
            fetch tftp-hpa "$HPA_PORT" "$window"
            t1=$(now)
            touch "$WORK/stop"
            wait "$sampler"
            hpa_s=$(awk -v a="$hpa_s" -v s="$t0" -v e="$t1" 'BEGIN { print a + e - s }')
            hpa_t=$((hpa_t + $(cat "$WORK/ticks")))
        done
        row mprov-tftp "$window" "$ours_s" "$ours_t"
        row tftp-hpa "$window" "$hpa_s" "$hpa_t"
    done
}

"$SERVE" "$WORK/root" 127.0.0.1:0 >"$WORK/ours.addr" 2>"$WORK/ours.log" &
PIDS+=($!)
OURS_PID=$!
wait_for "$WORK/ours.addr"
OURS_PORT=$(cut -d: -f2 <"$WORK/ours.addr")

# in.tftpd needs a fixed port: take one the kernel just handed out.
HPA_PORT=$(python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$IN_TFTPD" --foreground --listen --address "127.0.0.1:$HPA_PORT" --secure "$WORK/root" \
    2>"$WORK/hpa.log" &
PIDS+=($!)
HPA_PID=$!
# Bounded polling until it answers.
for _ in $(seq 100); do
    timeout 5 atftp -g -r file.bin -l /dev/null 127.0.0.1 "$HPA_PORT" >/dev/null 2>&1 && break
    sleep 0.05
done

echo "TFTP, ${SIZE_MIB} MiB file, blksize 1468, $(atftp --version 2>&1 | head -1), $RUNS runs each, $(nproc) cores, $(date -u +%FT%TZ)"
echo
echo "| server       | windowsize | MiB/s (mean) | server CPU ms/xfer |"
echo "|--------------|-----------:|-------------:|-------------------:|"
bench
