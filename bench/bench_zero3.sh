#!/usr/bin/env bash
# Step time of ZeRO-3 (fully sharded parameters) against ZeRO-2 on dp 2, with the next
# unit's gather prefetched and without (--zero3-prefetch false), as ratios measured in one
# run; ZeRO-2 against ZeRO-1 (what reduce-scattering every micro-batch, unit by unit, costs
# against one reduce-scatter per step); and the parameter bytes each rank holds
# (memory_bytes.params: ZeRO-2 the whole model, ZeRO-3 its shard plus the units gathered at
# once) and the gradient bytes (the shard plus the work space measured).
#   bench/bench_zero3.sh <path of ndmesh> [steps]
set -euo pipefail
ndmesh=$1
steps=${2:-20}
mpirun=(mpirun --allow-run-as-root --oversubscribe)
model=(--layers 8 --hidden 256 --heads 8 --seq 64 --markov-vocab 32 --threads 1 --eval-batches 0 --steps "$steps"
  --warmup 2 --batch 16 --dp 2 --micro-batch 4 --json)
run() { "${mpirun[@]}" -np 2 "$ndmesh" train "${model[@]}" "$@" | tail -n 1; }
# Interleaved twice, so that a drift of the machine's load hits every variant alike.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for round in 1 2; do
  run --zero 1 > "$tmp/z1.$round"
  run --zero 2 > "$tmp/z2.$round"
  run --zero 3 > "$tmp/z3.$round"
  run --zero 3 --zero3-prefetch false > "$tmp/z3n.$round"
done
mean() { jq -s '(.[0].step_seconds + .[1].step_seconds) / 2' "$tmp/$1.1" "$tmp/$1.2"; }
z1=$(mean z1) z2=$(mean z2) z3=$(mean z3) z3n=$(mean z3n)
grads() { jq '.memory_bytes.grads + .memory_bytes.grad_workspace' "$tmp/$1.1"; }
awk -v a="$z2" -v b="$z3" -v c="$z3n" -v z1="$z1" -v g1="$(grads z1)" -v g2="$(grads z2)" -v steps="$steps" -v pa="$(jq .memory_bytes.params "$tmp/z2.1")" \
  -v pb="$(jq .memory_bytes.params "$tmp/z3.1")" -v gb="$(jq .memory_bytes.params_gathered "$tmp/z3.1")" 'BEGIN{
  printf "dp 2, 8 layers hidden 256 seq 64, batch 16 (2 micro-batches of 4 per rank), %d steps, mean of 2 rounds\n", steps
  printf "  step time: ZeRO-2 %.4f s, ZeRO-3 with prefetch %.4f s, ZeRO-3 without prefetch %.4f s\n", a, b, c
  printf "  ZeRO-3 / ZeRO-2: %.3f with prefetch (goal <= 1.25), %.3f without\n", b / a, c / a
  printf "  ZeRO-2 / ZeRO-1: %.3f (ZeRO-1 %.4f s: one reduce-scatter per step, ZeRO-2 one per micro-batch and unit)\n", a / z1, z1
  printf "  gradient bytes per rank (kept + work space): ZeRO-1 %.2f MiB, ZeRO-2 %.2f MiB\n", g1 / 1048576, g2 / 1048576
  printf "  parameter bytes per rank: ZeRO-2 %.2f MiB, ZeRO-3 %.2f MiB (%.2f MiB of it gathered units): %.3f of ZeRO-2\n",
         pa / 1048576, pb / 1048576, gb / 1048576, pb / pa
}'
