#!/usr/bin/env bash
# Image benchmark: mprov-image's pack (build --root) and unpack of a root tree
# against `tar | zstd -T0` and `zstd -dc | tar x` on the same tree, same run.
#
# The tree is real files: regular files from /usr (ELF binaries, libraries,
# docs), taken in `find` order until SIZE_MIB is reached, with their folders,
# copied with GNU tar. Both sides use zstd level 3 with as many workers as
# CPUs, and keep xattrs and numeric owners. Page cache is warm for both
# (the tree is read once before timing); the outputs go to the same disk.
# Reported per tool: best and mean wall time of RUNS, and the archive size.
#
# Needs: tar, zstd (apt-get install tar zstd), cargo. Runs as root (owners).
#
# Usage: tests/bench/image.sh [RUNS] [SIZE_MIB]   (defaults 3 and 1024)
#
# UNPACK_DIR=/dev/shm unpacks into that folder instead of the work folder:
# on a tmpfs the disk's write-back, which swings the on-disk figures by 2x
# from run to run on this machine, is out of the comparison.
set -euo pipefail

# `cargo xtask bench --smoke` (MPROV_BENCH_SMOKE=1): one run on 16 MiB with a
# debug build, only to prove the benchmark still works.
if [ "${MPROV_BENCH_SMOKE:-0}" = 1 ]; then
  RUNS=${1:-1}; SIZE_MIB=${2:-16}; PROFILE=debug
else
  RUNS=${1:-3}; SIZE_MIB=${2:-1024}; PROFILE=release
fi
HERE=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d /var/tmp/image-bench.XXXXXX)
UNPACK=$(mktemp -d "${UNPACK_DIR:-$WORK}/image-bench-unpack.XXXXXX")
trap 'rm -rf "$WORK" "$UNPACK"' EXIT

for tool in tar zstd; do
  command -v "$tool" >/dev/null || { echo "$tool is missing (apt-get install $tool)" >&2; exit 1; }
done

(cd "$HERE" && cargo build --quiet --profile "${PROFILE/debug/dev}" -p mprov-image --bin mprov-image)
TARGET=$(cd "$HERE" && cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
IMG="$TARGET/$PROFILE/mprov-image"

# The tree: regular files of /usr up to SIZE_MIB.
LIMIT=$((SIZE_MIB * 1024 * 1024))
find /usr -xdev -type f -printf '%s %p\n' >"$WORK/all" 2>/dev/null || true
awk -v limit="$LIMIT" '{ total += $1; if (total > limit) exit; sub(/^[0-9]+ /, ""); print }' \
  "$WORK/all" >"$WORK/list"
mkdir "$WORK/tree"
tar -cf - --xattrs --numeric-owner -T "$WORK/list" 2>/dev/null | tar -xpf - --xattrs -C "$WORK/tree"
BYTES=$(du -sb "$WORK/tree" | cut -f1)
FILES=$(find "$WORK/tree" | wc -l)
find "$WORK/tree" -type f -exec cat {} + >/dev/null  # warm the page cache

now() { date +%s.%N; }
# Runs "$@" once and prints its wall time in seconds.
timed() { local t0; t0=$(now); "$@"; echo "$(now) - $t0" | bc; }

declare -A T
record() { T[$1]="${T[$1]:-} $2"; }
for run in $(seq 1 "$RUNS"); do
  rm -rf "$WORK/out" "$WORK/gnu.tar.zst" "$UNPACK/u1" "$UNPACK/u2"
  record ours_pack "$(timed sh -c "\"$IMG\" build --quiet --no-kernel --no-agent --slug bench --root '$WORK/tree' --out '$WORK/out' --level 3 >/dev/null")"
  record gnu_pack "$(timed sh -c "tar -C '$WORK/tree' --xattrs --numeric-owner -cf - . | zstd -q -3 -T0 -o '$WORK/gnu.tar.zst'")"
  sync
  record ours_unpack "$(timed "$IMG" unpack --quiet "$WORK/out/bench/1/rootfs.tar.zst" "$UNPACK/u1" 2>/dev/null)"
  # Each unpack starts with no dirty pages of the other's to write back.
  sync
  mkdir "$UNPACK/u2"
  record gnu_unpack "$(timed sh -c "zstd -q -dc '$WORK/gnu.tar.zst' | tar --xattrs --xattrs-include='*' --numeric-owner -xpf - -C '$UNPACK/u2'")"
  sync
done
"$IMG" verify "$WORK/out/bench/1" >/dev/null

stats() { echo "$*" | tr ' ' '\n' | awk 'NF { n++; s += $1; if (min == "" || $1 < min) min = $1 } END { printf "%.2f s best, %.2f s mean", min, s / n }'; }
mib() { echo "scale=1; $1 / 1048576" | bc; }
echo "tree: $(mib "$BYTES") MiB in $FILES entries; $RUNS run(s); $(nproc) CPUs; load average $(cut -d' ' -f1-3 /proc/loadavg); unpacked on $(stat -f -c %T "$UNPACK")"
echo "pack    mprov-image build            : $(stats ${T[ours_pack]}), $(mib "$(stat -c %s "$WORK/out/bench/1/rootfs.tar.zst")") MiB"
echo "pack    tar | zstd -3 -T0            : $(stats ${T[gnu_pack]}), $(mib "$(stat -c %s "$WORK/gnu.tar.zst")") MiB"
echo "unpack  mprov-image unpack           : $(stats ${T[ours_unpack]})"
echo "unpack  zstd -dc | tar x             : $(stats ${T[gnu_unpack]})"
