#!/usr/bin/env bash
# Agent streaming benchmark: what /init does in step 3 (HTTP stream of
# rootfs.tar.zst, sha256, zstd, unpack, in one pass) against the shell ways
# on the same image, same run, from the same real mprov-jobserver on
# loopback:
#   ours   mprov-agent fetch --size --sha256 --into DIR URL   (verified)
#   plain  zstd -dc FILE | tar x            (local file: no network, no hash)
#   shell  curl URL | tee >(sha256sum) | zstd -d | tar x   (the incumbent
#          with a checksum, as a busybox or dracut initramfs would stream)
#
# The tree is regular files of /usr up to SIZE_MIB, copied with GNU tar and
# packed with tar | zstd -3. Everything unpacks into UNPACK_DIR (default
# /dev/shm: the agent's staging area is a tmpfs), emptied between runs.
# Reported: best and mean wall time of RUNS, MiB/s of the compressed image,
# and ours / shell (goal: at least 2.0x the shell pipeline with sha256).
#
# The floor, measured in the same rounds on the same tree: what any verified
# stream of this image must spend on this machine, as CPU seconds (user +
# system, best of RUNS) of the three jobs done alone:
#   create  tar --no-same-owner -xf TAR -C DIR  (the decompressed tar, on the
#           same tmpfs: only file creation, with the agent's system calls
#           per file as root: openat with the file's mode, write, utimensat,
#           close; no fchown or fchmod)
#   zstd    zstd --no-asyncio -dc FILE >/dev/null  (one frame: one thread)
#   sha256  openssl dgst -sha256 FILE  (with the CPU's SHA extensions, as
#           the agent's sha2 uses them; coreutils' sha256sum does not, and
#           costs 5x more: it is the fallback without openssl)
# floor = max((create + zstd + sha256) / CPUs, zstd, sha256): the work
# spread over every CPU, or the longest stage that cannot be split (file
# creation is split over the agent's writer threads; zstd's one frame and
# the hash are not). Reported with ours / floor (goal: 1.25x at most) and
# the CPU seconds of each agent fetch (its threads together).
#
# Needs: tar, zstd, curl, coreutils, openssl (apt-get install tar zstd curl
# openssl), python3, bc, cargo.
#
# Usage: tests/bench/agent.sh [RUNS] [SIZE_MIB]   (defaults 3 and 512)
#        AGENT_BIN=... JOBSERVER_BIN=... tests/bench/agent.sh   (no build)
#        AGENT_BASE_BIN=... adds that agent (e.g. main's) as a fourth
#        contender in the same runs, to measure a change.
set -euo pipefail

# `cargo xtask bench --smoke` (MPROV_BENCH_SMOKE=1): one run on 16 MiB with a
# debug build, only to prove the benchmark still works.
if [ "${MPROV_BENCH_SMOKE:-0}" = 1 ]; then
  RUNS=${1:-1}; SIZE_MIB=${2:-16}; PROFILE=debug
else
  RUNS=${1:-3}; SIZE_MIB=${2:-512}; PROFILE=release
fi
HERE=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d /var/tmp/agent-bench.XXXXXX)
UNPACK=$(mktemp -d "${UNPACK_DIR:-/dev/shm}/agent-bench-unpack.XXXXXX")
JS_PID=
cleanup() {
  if [ -n "$JS_PID" ]; then kill "$JS_PID" 2>/dev/null || true; wait "$JS_PID" 2>/dev/null || true; fi
  rm -rf "$WORK" "$UNPACK"
}
trap cleanup EXIT

for tool in tar zstd curl sha256sum python3; do
  command -v "$tool" >/dev/null || { echo "$tool is missing (apt-get install $tool)" >&2; exit 1; }
done

# AGENT_BIN and JOBSERVER_BIN use binaries already built (e.g. the static
# agent of `cargo xtask agent`, which is what nodes run) instead of building.
if [ -z "${AGENT_BIN:-}" ] || [ -z "${JOBSERVER_BIN:-}" ]; then
  (cd "$HERE" && cargo build --quiet --profile "${PROFILE/debug/dev}" -p mprov-agent --bin mprov-agent \
    -p mprov-boot --bin mprov-jobserver)
  TARGET=$(cd "$HERE" && cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
fi
AGENT=${AGENT_BIN:-$TARGET/$PROFILE/mprov-agent}
JOBSERVER=${JOBSERVER_BIN:-$TARGET/$PROFILE/mprov-jobserver}

# The tree: regular files of /usr up to SIZE_MIB, packed by GNU tar and zstd.
LIMIT=$((SIZE_MIB * 1024 * 1024))
find /usr -xdev -type f -printf '%s %p\n' >"$WORK/all" 2>/dev/null || true
awk -v limit="$LIMIT" '{ total += $1; if (total > limit) exit; sub(/^[0-9]+ /, ""); print }' \
  "$WORK/all" >"$WORK/list"
mkdir "$WORK/tree"
tar -cf - --numeric-owner -T "$WORK/list" 2>/dev/null | tar -xpf - -C "$WORK/tree"
FILES=$(find "$WORK/tree" | wc -l)
IMAGE="$WORK/export/images/bench/1/rootfs.tar.zst"
mkdir -p "$(dirname "$IMAGE")"
tar -C "$WORK/tree" --numeric-owner -cf - . | zstd -q -3 -T0 -o "$IMAGE"
rm -rf "$WORK/tree"
SIZE=$(stat -c %s "$IMAGE")
SUM=$(sha256sum "$IMAGE" | cut -d' ' -f1)
cat "$IMAGE" >/dev/null  # warm the page cache, for every contender alike

# A real job server on a free loopback port.
PORTS=$(python3 -c 'import socket
ports = []
for _ in range(2):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); ports.append(s); 
print(" ".join(str(s.getsockname()[1]) for s in ports))')
read -r HTTP_PORT METRICS_PORT <<<"$PORTS"
echo '{"revision": 1}' >"$WORK/boot.json"
"$JOBSERVER" --boot-config "$WORK/boot.json" --no-dhcp --no-tftp --no-dns --no-ra \
  --http "127.0.0.1:$HTTP_PORT" --metrics "127.0.0.1:$METRICS_PORT" \
  --export "$WORK/export" --state-dir "$WORK/state" --log warn 2>"$WORK/jobserver.log" &
JS_PID=$!
URL="http://127.0.0.1:$HTTP_PORT/images/bench/1/rootfs.tar.zst"
for _ in $(seq 1 200); do
  curl -sf -o /dev/null -r 0-0 "$URL" && break
  sleep 0.05
done
curl -sf -o /dev/null -r 0-0 "$URL" || { cat "$WORK/jobserver.log" >&2; echo "the job server did not start" >&2; exit 1; }

# Runs "$@" once (its output to /dev/null) and prints its wall time and its
# CPU time (user + system, its children's included) in seconds.
measure() {
  python3 -c 'import resource, subprocess, sys, time
t0 = time.monotonic()
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True)
wall = time.monotonic() - t0
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(f"{wall:.4f} {r.ru_utime + r.ru_stime:.4f}")' "$@"
}
fresh() { rm -rf "$UNPACK/u"; mkdir "$UNPACK/u"; sync; }

# The decompressed tar, on the tmpfs the contenders unpack into (the floor's
# file creation reads it from there).
zstd -q -dc "$IMAGE" >"$UNPACK/image.tar"

if command -v openssl >/dev/null; then SHA256_CMD=(openssl dgst -sha256); else SHA256_CMD=(sha256sum); fi

declare -A T C
# record NAME "WALL CPU"
record() { local wall cpu; read -r wall cpu <<<"$2"; T[$1]="${T[$1]:-} $wall"; C[$1]="${C[$1]:-} $cpu"; }
for run in $(seq 1 "$RUNS"); do
  fresh
  record ours "$(measure "$AGENT" fetch --size "$SIZE" --sha256 "$SUM" --into "$UNPACK/u" "$URL")"
  if [ -n "${AGENT_BASE_BIN:-}" ]; then
    fresh
    record base "$(measure "$AGENT_BASE_BIN" fetch --size "$SIZE" --sha256 "$SUM" --into "$UNPACK/u" "$URL")"
  fi
  fresh
  record plain "$(measure sh -c "zstd -q -dc '$IMAGE' | tar --numeric-owner -xpf - -C '$UNPACK/u'")"
  fresh
  record shell "$(measure bash -c "set -o pipefail; curl -sSf '$URL' | tee >(sha256sum >'$WORK/sum') | zstd -q -d | tar --numeric-owner -xpf - -C '$UNPACK/u'")"
  sleep 0.2  # the process substitution's sha256sum finishes on its own
  [ "$(cut -d' ' -f1 "$WORK/sum")" = "$SUM" ] || { echo "the shell pipeline's sha256 differs" >&2; exit 1; }
  # The floor's parts, alone, in the same round.
  fresh
  record create "$(measure tar --no-same-owner -xf "$UNPACK/image.tar" -C "$UNPACK/u")"
  record zstd "$(measure zstd -q --no-asyncio -dc "$IMAGE")"
  record sha256 "$(measure "${SHA256_CMD[@]}" "$IMAGE")"
done

stats() { echo "$*" | tr ' ' '\n' | awk 'NF { n++; s += $1; if (min == "" || $1 < min) min = $1 } END { printf "%.2f s best, %.2f s mean", min, s / n }'; }
best() { echo "$*" | tr ' ' '\n' | awk 'NF { if (min == "" || $1 < min) min = $1 } END { print min }'; }
rate() { echo "scale=0; $SIZE / 1048576 / $(best "$@")" | bc; }
mib() { echo "scale=1; $1 / 1048576" | bc; }
echo "image: $(mib "$SIZE") MiB compressed, $FILES entries; $RUNS run(s); $(nproc) CPUs; load average $(cut -d' ' -f1-3 /proc/loadavg); unpacked on $(stat -f -c %T "$UNPACK")"
echo "ours   mprov-agent fetch (verified)           : $(stats ${T[ours]}), $(rate ${T[ours]}) MiB/s"
echo "plain  zstd -dc FILE | tar x (no net, no hash): $(stats ${T[plain]}), $(rate ${T[plain]}) MiB/s"
echo "shell  curl | tee >(sha256sum) | zstd -d | tar x: $(stats ${T[shell]}), $(rate ${T[shell]}) MiB/s"
if [ -n "${AGENT_BASE_BIN:-}" ]; then
  echo "base   $AGENT_BASE_BIN fetch (verified): $(stats ${T[base]}), $(rate ${T[base]}) MiB/s; ours vs base: $(echo "scale=2; $(best ${T[base]}) / $(best ${T[ours]})" | bc)x"
fi
echo "ours vs shell: $(echo "scale=2; $(best ${T[shell]}) / $(best ${T[ours]})" | bc)x (goal 2.0x); ours vs plain: $(echo "scale=2; $(best ${T[plain]}) / $(best ${T[ours]})" | bc)x"
cpus=$(nproc)
read -r A B S <<<"$(best ${C[create]}) $(best ${C[zstd]}) $(best ${C[sha256]})"
FLOOR=$(echo "$A $B $S $cpus" | awk '{ f = ($1 + $2 + $3) / $4; if ($2 > f) f = $2; if ($3 > f) f = $3; printf "%.3f", f }')
echo "floor: $FLOOR s = max((create $A + zstd $B + sha256 $S CPU s) / $cpus CPUs, zstd $B, sha256 $S) (best of $RUNS each; sha256 by ${SHA256_CMD[*]})"
echo "ours CPU per fetch: $(stats ${C[ours]})${AGENT_BASE_BIN:+; base CPU: $(stats ${C[base]})}"
# On a loaded machine wall times stretch with the load and the floor (CPU
# seconds) does not: the CPU ratio is the figure that holds there.
echo "ours CPU vs the floor's CPU (create + zstd + sha256 = $(echo "$A + $B + $S" | bc) s): $(echo "scale=2; $(best ${C[ours]}) / ($A + $B + $S)" | bc)x${AGENT_BASE_BIN:+; base: $(echo "scale=2; $(best ${C[base]}) / ($A + $B + $S)" | bc)x}"
echo "ours vs floor: $(echo "scale=2; $(best ${T[ours]}) / $FLOOR" | bc)x (goal 1.25x at most)${AGENT_BASE_BIN:+; base vs floor: $(echo "scale=2; $(best ${T[base]}) / $FLOOR" | bc)x}"
