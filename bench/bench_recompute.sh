#!/usr/bin/env bash
# Activation recompute: step time and measured activation bytes of --recompute selective
# and full against none, measured in the same run (the three modes interleaved, ROUNDS
# rounds, the median step time of each), serially and on pp 2 (one BLAS thread per rank).
# The losses of the three modes are bit-identical (tests/mpi/train_recompute.sh); this is
# what that costs and saves.
#   bench/bench_recompute.sh <path of ndmesh> [steps]
set -euo pipefail
ndmesh=$1
steps=${2:-6}
rounds=${ROUNDS:-3}
mpirun=(mpirun --allow-run-as-root --oversubscribe)
model=(--layers 4 --hidden 256 --heads 8 --kv-heads 4 --seq 256 --batch 8 --markov-vocab 64 --threads 1
  --eval-batches 0 --steps "$steps" --warmup 2 --json)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "recompute benchmark: 4 layers, hidden 256, 8 heads / 4 kv heads, seq 256, batch 8, $steps steps, $rounds rounds"
for layout in "1" "2 --pp 2 --micro-batch 2"; do
  set -- $layout
  np=$1
  shift
  for ((r = 0; r < rounds; r++)); do
    for mode in none selective full; do
      if [ "$np" -gt 1 ]; then
        "${mpirun[@]}" -np "$np" "$ndmesh" train "${model[@]}" "$@" --recompute $mode | tail -n 1 > "$tmp/$mode.$r.json"
      else
        "$ndmesh" train "${model[@]}" --recompute $mode | tail -n 1 > "$tmp/$mode.$r.json"
      fi
    done
  done
  median() { jq -s "[.[].step_seconds] | sort | .[length / 2 | floor]" "$tmp/$1".*.json; }
  bytes() { jq -s '.[0].activation_bytes_per_rank | max' "$tmp/$1".*.json; }
  base_t=$(median none)
  base_b=$(bytes none)
  echo "  layout: ${*:-serial}"
  for mode in none selective full; do
    awk -v t="$(median $mode)" -v b="$(bytes $mode)" -v bt="$base_t" -v bb="$base_b" -v m="$mode" 'BEGIN{
      printf "    %-10s step %.4f s  time ratio %.3f  activations %.2f MiB (largest rank)  bytes ratio %.3f\n",
             m, t, t / bt, b / 1048576, b / bb }'
  done
done
