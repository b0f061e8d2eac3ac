#!/usr/bin/env bash
# Optimizer offload (--offload optimizer): the step time against the same run without
# offload (a ratio from one run; goal <= 1.5x with the streaming overlap), and the disk
# bandwidth the streaming reached (bytes read and written over the time its I/O tasks took)
# against `ndmesh calibrate`'s measured disk rates on the same folder.
#   bench/bench_offload.sh <path to ndmesh> [offload folder (a real disk)] [layers]
set -euo pipefail
ndmesh=$1
dir=${2:-$(mktemp -d)}
layers=${3:-4}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cal=$("$ndmesh" calibrate --output "$tmp/hw.toml" --seconds 2 --disk-dir "$dir" --json | tail -n 1)
model=(--layers "$layers" --hidden 1024 --heads 8 --kv-heads 8 --seq 16 --batch 1 --steps 4 --warmup 0
  --eval-batches 0 --threads 2 --json)
base=$("$ndmesh" train "${model[@]}" | tail -n 1)
off=$("$ndmesh" train "${model[@]}" --offload optimizer --offload-dir "$dir" | tail -n 1)
jq -n -r --argjson a "$base" --argjson b "$off" --argjson c "$cal" '
  ($b.offload_io.bytes_read_per_step + $b.offload_io.bytes_written_per_step) as $bytes |
  "model: \($a.parameters) parameters, optimizer state \($b.memory_bytes.optimizer_offloaded / 1048576 | floor) MiB",
  "step time: \($a.step_seconds * 1000 | floor) ms without offload, \($b.step_seconds * 1000 | floor) ms with it: ratio \($b.step_seconds / $a.step_seconds * 1000 | floor / 1000) (goal <= 1.5)",
  "disk: \($bytes / 1048576 | floor) MiB moved per step in \($b.offload_io.io_seconds_per_step * 1000 | floor) ms of I/O tasks = \($bytes / $b.offload_io.io_seconds_per_step / 1e9 * 1000 | floor / 1000) GB/s; calibrate: \($c.disk_read_gbps * 1000 | floor / 1000) GB/s read, \($c.disk_write_gbps * 1000 | floor / 1000) GB/s write"'
