#!/usr/bin/env bash
# TFTP benchmark: mprov-tftp vs tftp-hpa's in.tftpd on loopback, same run.
#
# A 30 MiB random file is fetched with atftp (blksize 1468, windowsize 1, 16
# and 64, tsize 0) from each server, RUNS times per setting, interleaved (one
# fetch from ours, one from tftp-hpa, and again), so that load from other
# work on the machine falls on both alike. Reported per setting: mean
# throughput and the server's CPU time per transfer, counted by `perf stat -e
# task-clock` (the kernel's exact on-CPU time, all threads, children
# included): ours is one process, counted with `perf stat -p` over the
# setting's fetches; in.tftpd forks a child per transfer and ignores SIGCHLD
# (SA_NOCLDWAIT), so neither /proc nor wait4 ever see the children's time:
# each setting gets a fresh in.tftpd started under `perf stat`, which
# inherits the count into every child. Both servers sit idle while the other
# one serves. (The earlier method, tick-based utime+stime from /proc and a
# 5 ms sampler of in.tftpd's children, misattributed a process that sleeps
# once per block, and the sampler's own CPU slowed both sides.)
#
# Note: tftp-hpa 5.2 does not implement windowsize (RFC 7440), so its OACK
# leaves it out and atftp falls back to lock-step: its rows at windowsize 16
# and 64 show what a client gets from it when asking for a window.
#
# Needs: atftp, tftpd-hpa (apt-get install tftpd-hpa; its service does not
# need to run), linux-perf, cargo. Bounded: every fetch runs under `timeout`.
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
    # The in.tftpd under perf, if a round was cut short.
    if [ -s "$WORK/hpa.pid" ]; then kill "$(cat "$WORK/hpa.pid")" 2>/dev/null || true; fi
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$WORK"
}
trap cleanup EXIT

command -v atftp >/dev/null || { echo "atftp is missing (apt-get install atftp)" >&2; exit 1; }
command -v perf >/dev/null || { echo "perf is missing (apt-get install linux-perf)" >&2; exit 1; }
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

# Waits (bounded polling) until a file is non-empty.
wait_for() {
    for _ in $(seq 100); do
        [ -s "$1" ] && return 0
        sleep 0.05
    done
    echo "timed out waiting for $1" >&2
    return 1
}

# The task-clock milliseconds a `perf stat -x,` output file counted.
task_ms() {
    awk -F, '$3 == "task-clock" { ms += $1 } END { printf "%.3f", ms + 0 }' "$1"
}

# A port the kernel just handed out (in.tftpd needs a fixed one).
free_port() {
    python3 -c 'import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
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

# row NAME WINDOW SECONDS MS: one table row (means over RUNS).
row() {
    awk -v n="$1" -v w="$2" -v secs="$3" -v t="$4" -v r="$RUNS" -v mib="$SIZE_MIB" 'BEGIN {
        printf "| %-12s | %10d | %12.1f | %18.1f |\n", n, w, mib / (secs / r), t / r
    }'
}

# bench: for each window, RUNS rounds of one fetch from ours then one from
# tftp-hpa, so both see the same machine load (others may be compiling).
# CPU: `perf stat -p` on ours and a fresh in.tftpd under `perf stat`, both
# over the whole round of fetches.
bench() {
    for window in 1 16 64; do
        local ours_s=0 hpa_s=0 t0 t1 ours_perf hpa_perf hpa_port perf_ours perf_hpa
        ours_perf="$WORK/ours-$window.perf"
        hpa_perf="$WORK/hpa-$window.perf"
        hpa_port=$(free_port)
        rm -f "$WORK/hpa.pid"
        perf stat -x, -e task-clock -o "$hpa_perf" -- \
            sh -c 'echo $$ > "$0"; exec "$@"' "$WORK/hpa.pid" \
            "$IN_TFTPD" --foreground --listen --address "127.0.0.1:$hpa_port" --secure "$WORK/root" \
            2>>"$WORK/hpa.log" &
        perf_hpa=$!
        PIDS+=("$perf_hpa")
        wait_for "$WORK/hpa.pid"
        # Bounded polling until it answers (a missing file: no transfer).
        # (No pipeline: atftp fails on purpose, and pipefail would hide the
        # answer, so every probe would run and count as tftp-hpa's CPU.)
        local probe
        for _ in $(seq 100); do
            probe=$(timeout 5 atftp -g -r no-such-file -l /dev/null 127.0.0.1 "$hpa_port" 2>&1 || true)
            case "$probe" in *[Nn]ot\ [Ff]ound*) break ;; esac
            sleep 0.05
        done
        perf stat -x, -e task-clock -p "$OURS_PID" -o "$ours_perf" &
        perf_ours=$!
        PIDS+=("$perf_ours")
        sleep 0.2
        for _ in $(seq "$RUNS"); do
            t0=$(now)
            fetch mprov-tftp "$OURS_PORT" "$window"
            t1=$(now)
            ours_s=$(awk -v a="$ours_s" -v s="$t0" -v e="$t1" 'BEGIN { print a + e - s }')
            t0=$(now)
            fetch tftp-hpa "$hpa_port" "$window"
            t1=$(now)
            hpa_s=$(awk -v a="$hpa_s" -v s="$t0" -v e="$t1" 'BEGIN { print a + e - s }')
        done
        kill -INT "$perf_ours"
        wait "$perf_ours" || true
        kill "$(cat "$WORK/hpa.pid")"
        wait "$perf_hpa" || true
        row mprov-tftp "$window" "$ours_s" "$(task_ms "$ours_perf")"
        row tftp-hpa "$window" "$hpa_s" "$(task_ms "$hpa_perf")"
    done
}

"$SERVE" "$WORK/root" 127.0.0.1:0 >"$WORK/ours.addr" 2>"$WORK/ours.log" &
PIDS+=($!)
OURS_PID=$!
wait_for "$WORK/ours.addr"
OURS_PORT=$(cut -d: -f2 <"$WORK/ours.addr")

echo "TFTP, ${SIZE_MIB} MiB file, blksize 1468, $(atftp --version 2>&1 | head -1), $RUNS runs each, $(nproc) cores, $(date -u +%FT%TZ)"
echo
echo "| server       | windowsize | MiB/s (mean) | server CPU ms/xfer |"
echo "|--------------|-----------:|-------------:|-------------------:|"
bench
