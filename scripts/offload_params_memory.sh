#!/usr/bin/env bash
# --offload optimizer+params lowers the resident set: trains ZeRO-3 on dp 2 with the moments
# offloaded, then with the parameters' shard offloaded too, and measures each rank's peak
# resident set of the training steps (VmHWM from /proc/<pid>/status, reset with
# /proc/<pid>/clear_refs once step 1 is printed, so that the model's construction and the
# first step do not count; polled every 50 ms).
# The goal: the peak falls by about the shard's bytes (memory_bytes.params_offloaded), less
# the streamed chunk. The losses must be the same bit for bit. The peak up to step 1 (VmHWM
# just before the reset: the model's construction and the first step) is printed too.
#   scripts/offload_params_memory.sh <path to ndmesh> [OFFLOAD_DIR]
# OFFLOAD_DIR: on a disk, not tmpfs (default: a temporary folder under /var/tmp).
# Environment: MODEL (train flags; default 8 blocks of width 768, about 57M parameters),
# STEPS (4), CHUNK_MB (--offload-chunk-mb, 8), MPIRUN (default mpirun).
set -euo pipefail
ndmesh=${1:?usage: scripts/offload_params_memory.sh <path to ndmesh> [OFFLOAD_DIR]}
steps=${STEPS:-4}
model=${MODEL:-"--layers 8 --hidden 768 --heads 12 --kv-heads 12 --seq 16 --markov-vocab 64"}
command -v jq > /dev/null || { echo "offload_params_memory.sh: needs jq (apt-get install jq)" >&2; exit 2; }
tmp=$(mktemp -d)
own_dir=""
if [ -n "${2:-}" ]; then
  dir=$2
else
  dir=$(mktemp -d /var/tmp/ndmesh_offload.XXXXXX)
  own_dir=$dir
fi
trap 'rm -rf "$tmp"; [ -z "$own_dir" ] || rm -rf "$own_dir"' EXIT

# run <mode>: trains; prints "<peak VmHWM bytes of the steps, largest rank> <peak VmHWM bytes up to
# step 1, largest rank>" and leaves the JSON in $tmp/<mode>.json.
run() {
  local mode=$1 pid ranks=() p hwm peak=0 early=0
  # shellcheck disable=SC2086
  "${MPIRUN:-mpirun}" --allow-run-as-root --oversubscribe -np 2 "$ndmesh" train $model --batch 2 --steps "$steps" \
    --warmup 0 --eval-batches 0 --threads 1 --json --dp 2 --zero 3 --offload "$mode" --offload-dir "$dir" \
    --offload-chunk-mb "${CHUNK_MB:-8}" > "$tmp/$mode.out" 2> "$tmp/$mode.err" &
  pid=$!
  until grep -q '^step 1/' "$tmp/$mode.out" 2> /dev/null; do
    kill -0 "$pid" 2> /dev/null || { echo "$mode: the run ended before step 1: $(tail -3 "$tmp/$mode.err")" >&2; exit 1; }
    sleep 0.05
  done
  mapfile -t ranks < <(pgrep -P "$pid" -x ndmesh)
  [ "${#ranks[@]}" = 2 ] || { echo "$mode: found ${#ranks[@]} rank processes under mpirun, not 2" >&2; exit 1; }
  for p in "${ranks[@]}"; do
    hwm=$(awk '/^VmHWM:/ { print $2 * 1024 }' "/proc/$p/status")
    [ "$hwm" -le "$early" ] || early=$hwm
    echo 5 > "/proc/$p/clear_refs"  # VmHWM := VmRSS
  done
  declare -A last
  while kill -0 "$pid" 2> /dev/null; do
    for p in "${ranks[@]}"; do
      hwm=$(awk '/^VmHWM:/ { print $2 * 1024 }' "/proc/$p/status" 2> /dev/null || true)
      [ -z "$hwm" ] || last[$p]=$hwm
    done
    sleep 0.05
  done
  wait "$pid" || { echo "$mode: exit $?: $(tail -3 "$tmp/$mode.err")" >&2; exit 1; }
  for p in "${ranks[@]}"; do [ "${last[$p]:-0}" -le "$peak" ] || peak=${last[$p]}; done
  tail -n 1 "$tmp/$mode.out" > "$tmp/$mode.json"
  echo "$peak $early"
}
ra=$(run optimizer)
rb=$(run optimizer+params)
read -r a a0 <<< "$ra"
read -r b b0 <<< "$rb"
[ "$(jq -c .losses "$tmp/optimizer.json")" = "$(jq -c .losses "$tmp/optimizer+params.json")" ] || {
  echo "FAIL: the losses differ: $(jq -c .losses "$tmp/optimizer.json" "$tmp/optimizer+params.json")" >&2
  exit 1
}
jq -n -r --argjson a "$a" --argjson b "$b" --argjson a0 "$a0" --argjson b0 "$b0" --slurpfile x "$tmp/optimizer.json" --slurpfile y "$tmp/optimizer+params.json" '
  ($y[0].memory_bytes.params_offloaded) as $shard | ($a - $b) as $drop |
  "model: \($x[0].parameters) parameters, ZeRO-3 on dp 2; the shard of the parameters: \($shard / 1048576 | . * 10 | floor / 10) MiB a rank",
  "peak resident set of steps 2..: \($a / 1048576 | floor) MiB with --offload optimizer, \($b / 1048576 | floor) MiB with optimizer+params: \($drop / 1048576 | floor) MiB lower = \(100 * $drop / $shard | floor)% of the shard",
  "peak resident set up to step 1 (construction included): \($a0 / 1048576 | floor) MiB with --offload optimizer, \($b0 / 1048576 | floor) MiB with optimizer+params",
  "memory_bytes.params: \($x[0].memory_bytes.params / 1048576 | floor) MiB vs \($y[0].memory_bytes.params / 1048576 | floor) MiB (gathered units only)",
  "step time: \($x[0].step_seconds) s vs \($y[0].step_seconds) s; bytes read per step \($x[0].offload_io.bytes_read_per_step) vs \($y[0].offload_io.bytes_read_per_step)",
  "losses: equal bit for bit"'
