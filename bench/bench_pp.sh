#!/usr/bin/env bash
# Pipeline bubble, measured vs simulated: `ndmesh train --pp P` with M micro-batches for
# each schedule; the run measures every action (start, end) and reports the idle share of
# stage time (the bubble) next to what the simulator predicts for the same schedule with
# the forward / backward costs measured in that run. The ratio measured / simulated is
# the figure of merit (target within 10%, i.e. 0.9 .. 1.1). With P ranks on fewer cores
# the ranks share cores and the bubble is distorted: such rows are marked oversubscribed.
#   bench/bench_pp.sh <path of ndmesh> [pp] [steps]
set -euo pipefail
ndmesh=$1
pp=${2:-2}
steps=${3:-12}
cores=$(nproc)
mpirun=(mpirun --allow-run-as-root --oversubscribe)
model=(--layers 8 --hidden 256 --heads 8 --seq 64 --markov-vocab 32 --threads 1 --eval-batches 0 --steps "$steps"
  --warmup 2 --batch 8 --micro-batch 1 --json)
note=""
[ "$pp" -gt "$cores" ] && note=" (oversubscribed: $pp ranks on $cores cores)"
echo "pp $pp, 8 micro-batches of 1 sequence, 8 layers hidden 256 seq 64, $steps steps (the first left out)$note"
printf "  %-12s %9s %9s %6s %10s %6s %8s %9s %8s\n" schedule measured simulated ratio "per stage" ratio "fwd ms" "bwd-in ms" "bwd-w ms"
for schedule in gpipe 1f1b interleaved zb-h1; do
  extra=()
  [ "$schedule" = interleaved ] && extra=(--virtual-stages 2)
  out=$("${mpirun[@]}" -np "$pp" "$ndmesh" train "${model[@]}" --pp "$pp" --schedule "$schedule" "${extra[@]}" |
    tail -n 1)
  jq -r --arg s "$schedule" '.pipeline | [$s, .bubble_measured * 100, .bubble_simulated * 100,
      .bubble_measured / .bubble_simulated, .bubble_simulated_stages * 100,
      .bubble_measured / .bubble_simulated_stages,
      .forward_seconds * 1e3, .backward_input_seconds * 1e3, .backward_weight_seconds * 1e3] | @tsv' <<<"$out" |
    awk -F'\t' '{printf "  %-12s %8.1f%% %8.1f%% %6.2f %9.1f%% %6.2f %8.2f %9.2f %8.2f\n", $1, $2, $3, $4, $5, $6, $7, $8, $9}'
done
