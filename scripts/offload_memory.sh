#!/usr/bin/env bash
# --offload optimizer shrinks the resident set: trains a model whose AdamW state is over
# 1 GiB (about 138M parameters: 11 blocks of width 1024) for 2 steps with and without
# offload, and compares the peak resident set (memory_bytes.peak_rss, ru_maxrss) with the
# optimizer-state bytes (memory_bytes.optimizer of the in-memory run). The goal: the peak
# falls by at least 90% of the optimizer state. The offload files go to DIR (default: a
# temporary folder under $TMPDIR; use a real disk, not tmpfs, which is memory).
#   scripts/offload_memory.sh <path to ndmesh> [DIR]
set -euo pipefail
ndmesh=$1
dir=${2:-$(mktemp -d)}
model=(--layers 11 --hidden 1024 --heads 8 --kv-heads 8 --seq 16 --batch 1 --steps 2 --warmup 0 --eval-batches 0
  --threads 2 --json)
run() { "$ndmesh" train "${model[@]}" "$@" | tail -n 1; }
base=$(run)
off=$(run --offload optimizer --offload-dir "$dir")
[ "$(echo "$base" | jq -c .losses)" = "$(echo "$off" | jq -c .losses)" ] || {
  echo "FAIL: the losses differ with offload" >&2
  exit 1
}
jq -n -r --argjson a "$base" --argjson b "$off" '
  ($a.memory_bytes.optimizer) as $opt | ($a.memory_bytes.peak_rss - $b.memory_bytes.peak_rss) as $drop |
  "parameters \($a.parameters); optimizer state \($opt / 1048576 | floor) MiB in memory, \($b.memory_bytes.optimizer_offloaded / 1048576 | floor) MiB offloaded (window \($b.memory_bytes.optimizer / 1048576 | floor) MiB)",
  "peak RSS: \($a.memory_bytes.peak_rss / 1048576 | floor) MiB without offload, \($b.memory_bytes.peak_rss / 1048576 | floor) MiB with it: \($drop / 1048576 | floor) MiB lower = \(100 * $drop / $opt | floor)% of the optimizer state (goal >= 90%)",
  "step time: \($a.step_seconds) s without, \($b.step_seconds) s with offload (ratio \($b.step_seconds / $a.step_seconds * 100 | floor / 100))",
  if $drop >= 0.9 * $opt then "OK" else "FAIL: below 90%" end'
