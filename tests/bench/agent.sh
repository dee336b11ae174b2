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
# Needs: tar, zstd, curl, coreutils (apt-get install tar zstd curl), cargo.
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

now() { date +%s.%N; }
# Runs "$@" once and prints its wall time in seconds.
timed() { local t0; t0=$(now); "$@" >/dev/null; echo "$(now) - $t0" | bc; }
fresh() { rm -rf "$UNPACK/u"; mkdir "$UNPACK/u"; sync; }

declare -A T
record() { T[$1]="${T[$1]:-} $2"; }
for run in $(seq 1 "$RUNS"); do
  fresh
  record ours "$(timed "$AGENT" fetch --size "$SIZE" --sha256 "$SUM" --into "$UNPACK/u" "$URL")"
  if [ -n "${AGENT_BASE_BIN:-}" ]; then
    fresh
    record base "$(timed "$AGENT_BASE_BIN" fetch --size "$SIZE" --sha256 "$SUM" --into "$UNPACK/u" "$URL")"
  fi
  fresh
  record plain "$(timed sh -c "zstd -q -dc '$IMAGE' | tar --numeric-owner -xpf - -C '$UNPACK/u'")"
  fresh
  record shell "$(timed bash -c "set -o pipefail; curl -sSf '$URL' | tee >(sha256sum >'$WORK/sum') | zstd -q -d | tar --numeric-owner -xpf - -C '$UNPACK/u'")"
  sleep 0.2  # the process substitution's sha256sum finishes on its own
  [ "$(cut -d' ' -f1 "$WORK/sum")" = "$SUM" ] || { echo "the shell pipeline's sha256 differs" >&2; exit 1; }
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
