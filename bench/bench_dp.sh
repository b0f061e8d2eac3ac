#!/usr/bin/env bash
# Step time of data parallelism on 2 ranks (one per core here): overlapped bucketed
# reduction vs --no-overlap vs no communication at all (two independent serial runs of
# half the batch, side by side, so they share the machine the same way), and the
# fraction of the gradient communication hidden behind the backward:
#   hidden = 1 - exposed(overlap) / exposed(no overlap)
# (without overlap every reduction is exposed, so its exposed time is the whole cost).
#   bench/bench_dp.sh <path of ndmesh> [steps]
set -euo pipefail
ndmesh=$1
steps=${2:-30}
mpirun=(mpirun --allow-run-as-root --oversubscribe)
model=(--layers 8 --hidden 256 --heads 8 --seq 64 --markov-vocab 32 --threads 1 --eval-batches 0 --steps "$steps"
  --warmup 2 --json)
field() { jq -r ".$1" <<<"$2"; }
over=$("${mpirun[@]}" -np 2 "$ndmesh" train "${model[@]}" --batch 16 --dp 2 --bucket-mb 1 | tail -n 1)
plain=$("${mpirun[@]}" -np 2 "$ndmesh" train "${model[@]}" --batch 16 --dp 2 --bucket-mb 1 --no-overlap | tail -n 1)
tmp=$(mktemp -d)
"$ndmesh" train "${model[@]}" --batch 8 | tail -n 1 > "$tmp/a" &
"$ndmesh" train "${model[@]}" --batch 8 --seed 2 | tail -n 1 > "$tmp/b"
wait
alone=$(jq -s '(.[0].step_seconds + .[1].step_seconds) / 2' "$tmp/a" "$tmp/b")
rm -rf "$tmp"
awk -v o="$(field step_seconds "$over")" -v n="$(field step_seconds "$plain")" -v s="$alone" \
  -v eo="$(field exposed_comm_seconds "$over")" -v en="$(field exposed_comm_seconds "$plain")" -v steps="$steps" 'BEGIN{
  printf "dp 2, 8 layers hidden 256 seq 64, batch 16 (8 per rank), buckets of 1 MiB, %d steps\n", steps
  printf "  step time: overlap %.4f s, no overlap %.4f s, no communication (serial, batch 8) %.4f s\n", o, n, s
  printf "  overlap / no communication %.3f (target <= 1.15), no overlap / no communication %.3f\n", o / s, n / s
  printf "  gradient communication per step: %.4f s exposed without overlap, %.4f s with: %.0f%% hidden (target >= 80%%)\n",
         en / steps, eo / steps, 100 * (1 - eo / en)
}'
