#!/usr/bin/env bash
# Under a memory limit below the model's fp32 weights + AdamW state, the model fails to
# train without offload and trains with `--memory extreme` (full recompute, ZeRO-3 and the
# optimizer state in files), with the losses of an unlimited run.
#
# 1. A memory cgroup is made, swap forbidden: cgroup v2's memory.max (+ memory.swap.max 0)
#    where a cgroup2 mount has the memory controller, else cgroup v1's
#    memory.limit_in_bytes (+ memory.memsw.limit_in_bytes). Where neither can be made (not
#    root, no controller, a container without them) the script says why and exits 77
#    (ctest's skip).
# 2. An unlimited run (no limit, no offload) gives the reference losses and the bytes of the
#    fp32 weights and AdamW moments (memory_bytes.params + memory_bytes.optimizer); the
#    group's limit is LIMIT_FRACTION (default 0.9) of those bytes (or LIMIT_MIB).
# 3. The same run inside the cgroup must fail (the kernel's OOM killer ends it, or it
#    stops with an allocation error); the run with --memory extreme inside it must succeed,
#    and its losses and gradient norms must equal the unlimited run's
#    (tests/support/compare_runs.sh: losses 1e-5; full recompute and the streamed AdamW
#    step are the same arithmetic, so they are equal bit for bit in practice).
# The cgroup's own peak (memory.max_usage_in_bytes / memory.peak) is printed for each run.
#   scripts/memory_limit.sh <path to ndmesh> [OFFLOAD_DIR]
# OFFLOAD_DIR must be on a disk, not tmpfs (tmpfs files are memory charged to the cgroup);
# default: a temporary folder under /var/tmp. Environment: MODEL (train flags), STEPS (2),
# LIMIT_FRACTION, LIMIT_MIB, CHUNK_MB (--offload-chunk-mb of the extreme run, 8: a window of
# three 8 MiB chunks instead of the default 96 MiB).
set -euo pipefail
ndmesh=$(realpath "${1:?usage: scripts/memory_limit.sh <path to ndmesh> [OFFLOAD_DIR]}")
here=$(cd "$(dirname "$0")" && pwd)
steps=${STEPS:-2}
model=${MODEL:-"--layers 8 --hidden 768 --heads 12 --kv-heads 12 --seq 16 --markov-vocab 64"}
command -v jq > /dev/null || { echo "memory_limit.sh: needs jq (apt-get install jq)" >&2; exit 2; }
tmp=$(mktemp -d)
own_dir=""
if [ -n "${2:-}" ]; then
  offload_dir=$2
else
  offload_dir=$(mktemp -d /var/tmp/ndmesh_offload.XXXXXX)
  own_dir=$offload_dir
fi
group=""
cleanup() {
  if [ -n "$group" ] && [ -d "$group" ]; then rmdir "$group" 2> /dev/null || true; fi
  rm -rf "$tmp"
  [ -z "$own_dir" ] || rm -rf "$own_dir"
}
trap cleanup EXIT
skip() {
  echo "SKIP: memory_limit.sh: $*"
  exit 77
}
fail() {
  echo "FAIL: memory_limit.sh: $*" >&2
  exit 1
}
# shellcheck source=../tests/support/compare_runs.sh
source "$here/../tests/support/compare_runs.sh"
mib() { awk -v b="$1" 'BEGIN { printf "%.0f", b / 1048576 }'; }

# shellcheck disable=SC2206
flags=($model --batch 2 --steps "$steps" --warmup 0 --eval-batches 0 --threads 1 --json)

# 1. The cgroup: v2 where a cgroup2 mount has the memory controller, else v1.
kind="" why="" limit_file="" swap_file="" swap_value=""
v2=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/mounts)
if [ -n "$v2" ]; then
  if grep -qw memory "$v2/cgroup.controllers" 2> /dev/null; then
    # A child gets the controller only where its parent enables it for its children.
    echo +memory > "$v2/cgroup.subtree_control" 2> /dev/null || true
    if mkdir "$v2/ndmesh_memory_limit_$$" 2> /dev/null; then
      group="$v2/ndmesh_memory_limit_$$"
      if [ -e "$group/memory.max" ] && echo max > "$group/memory.max" 2> /dev/null; then
        limit_file=$group/memory.max swap_file=$group/memory.swap.max swap_value=0
        kind="cgroup v2 ($group/memory.max)"
      else
        rmdir "$group"
        group=""
        why="$v2: a new group has no writable memory.max"
      fi
    else
      why="$v2: cannot create a group (not root?)"
    fi
  else
    why="$v2 (cgroup v2) has no memory controller"
  fi
fi
if [ -z "$kind" ]; then
  v1=$(awk '$3 == "cgroup" && $4 ~ /(^|,)memory(,|$)/ { print $2; exit }' /proc/mounts)
  if [ -z "$v1" ]; then
    why="${why:+$why; }no cgroup v1 memory hierarchy is mounted"
  elif mkdir "$v1/ndmesh_memory_limit_$$" 2> /dev/null; then
    group="$v1/ndmesh_memory_limit_$$"
    if echo -1 > "$group/memory.limit_in_bytes" 2> /dev/null; then
      # No swap either (where swap accounting exists): over the limit means killed.
      limit_file=$group/memory.limit_in_bytes swap_file="" swap_value=""
      [ ! -e "$group/memory.memsw.limit_in_bytes" ] || swap_file=$group/memory.memsw.limit_in_bytes swap_value=LIMIT
      kind="cgroup v1 ($group/memory.limit_in_bytes)"
    else
      rmdir "$group"
      group=""
      why="${why:+$why; }$v1: memory.limit_in_bytes is not writable"
    fi
  else
    why="${why:+$why; }$v1: cannot create a group (not root?)"
  fi
fi
[ -n "$kind" ] || skip "no memory limit can be set here: $why"

# 2. The unlimited reference: its losses, and the bytes the limit is cut from.
"$ndmesh" train "${flags[@]}" > "$tmp/free.out" 2> "$tmp/free.err" ||
  fail "the unlimited run failed: $(tail -2 "$tmp/free.err")"
tail -n 1 "$tmp/free.out" > "$tmp/free.json"
states=$(jq '.memory_bytes.params + .memory_bytes.optimizer' "$tmp/free.json")
if [ -n "${LIMIT_MIB:-}" ]; then
  limit=$((LIMIT_MIB * 1048576))
else
  limit=$(awk -v s="$states" -v f="${LIMIT_FRACTION:-0.9}" 'BEGIN { printf "%.0f", s * f }')
fi

echo "$limit" > "$limit_file" || skip "the kernel did not take the limit of $limit bytes in $limit_file"
[ "$swap_value" != LIMIT ] || swap_value=$limit
[ -z "$swap_file" ] || echo "$swap_value" > "$swap_file" 2> /dev/null || true

# limited <name> <flags...>: runs ndmesh train inside the group; its exit status in $tmp/<name>.rc.
limited() {
  local name=$1
  shift
  # A fresh peak for each run (v1: max_usage_in_bytes is reset by writing 0).
  [ ! -e "$group/memory.max_usage_in_bytes" ] || echo 0 > "$group/memory.max_usage_in_bytes" 2> /dev/null || true
  set +e
  bash -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' _ "$group" "$ndmesh" train "${flags[@]}" "$@" \
    > "$tmp/$name.out" 2> "$tmp/$name.err"
  echo $? > "$tmp/$name.rc"
  set -e
  peak=$(cat "$group/memory.max_usage_in_bytes" 2> /dev/null || cat "$group/memory.peak" 2> /dev/null || echo 0)
  echo "$peak" > "$tmp/$name.peak"
}

# 3. Without offload: over the limit. With --memory extreme: trains.
limited plain
limited extreme --memory extreme --offload-dir "$offload_dir" --offload-chunk-mb "${CHUNK_MB:-8}"
plain_rc=$(cat "$tmp/plain.rc") extreme_rc=$(cat "$tmp/extreme.rc")

echo "model: $model, batch 2, $steps steps; $(jq .parameters "$tmp/free.json") parameters; offload chunks of ${CHUNK_MB:-8} MiB"
echo "fp32 weights + AdamW state: $(mib "$states") MiB; limit: $(mib "$limit") MiB, $kind"
echo "unlimited, no offload: peak RSS $(mib "$(jq .memory_bytes.peak_rss "$tmp/free.json")") MiB," \
  "$(jq .step_seconds "$tmp/free.json") s/step"
reason="exit $plain_rc"
[ "$plain_rc" != 137 ] || reason="killed by the OOM killer (SIGKILL, exit 137)"
echo "limited, no offload: $reason; group peak $(mib "$(cat "$tmp/plain.peak")") MiB$(
  grep -m1 'ndmesh:' "$tmp/plain.err" | sed 's/^/; /' || true)"
[ "$plain_rc" != 0 ] || fail "the run without offload trained under a limit below its weights + AdamW state"

[ "$extreme_rc" = 0 ] || fail "--memory extreme under the limit: exit $extreme_rc: $(tail -3 "$tmp/extreme.err")"
tail -n 1 "$tmp/extreme.out" > "$tmp/extreme.json"
echo "limited, --memory extreme: trained; group peak $(mib "$(cat "$tmp/extreme.peak")") MiB, peak RSS" \
  "$(mib "$(jq .memory_bytes.peak_rss "$tmp/extreme.json")") MiB, $(jq .step_seconds "$tmp/extreme.json") s/step" \
  "($(grep -m1 '^memory:' "$tmp/extreme.out" || echo 'memory: extreme'))"
expect_same "--memory extreme under the limit vs unlimited" "$tmp/free.json" "$tmp/extreme.json"
if [ "$(jq -c .losses "$tmp/free.json")" = "$(jq -c .losses "$tmp/extreme.json")" ]; then
  echo "losses: equal bit for bit: $(jq -c .losses "$tmp/extreme.json")"
else
  echo "losses: within the bounds of tests/support/compare_runs.sh: $(jq -c .losses "$tmp/extreme.json") vs" \
    "$(jq -c .losses "$tmp/free.json")"
fi
echo "memory_limit.sh: ok"
