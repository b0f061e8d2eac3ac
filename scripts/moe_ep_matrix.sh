#!/usr/bin/env bash
# Expert parallelism against the serial run, beyond tests/mpi/train_moe.sh: moe-tiny made small
# (as there), 4 steps, every --ep that divides --dp 2 / 4 / 8, with ZeRO 1 and 2, full recompute,
# both routers, a shared expert and a capacity factor. Prints one comparison line per layout
# (tests/support/compare_runs.sh's bounds) and fails on the first out of bounds.
#   scripts/moe_ep_matrix.sh [ndmesh]   (default build/bin/ndmesh; mpirun as root, oversubscribed)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build/bin/ndmesh}
source "$root/tests/mpi/train_lib.sh" mpirun --allow-run-as-root --oversubscribe "$bin"
export NDMESH_TIMEOUT_S=${NDMESH_TIMEOUT_S:-120}
steps=4
common=(--model moe-tiny --hidden 32 --expert-ffn 32 --seq 16 --markov-vocab 16 --threads 1 --eval-batches 1
  --warmup 1 --batch 16 --micro-batch 2 --steps $steps --json)
for variant in softmax sigmoid; do
  extra=()
  [ "$variant" = sigmoid ] && extra=(--router sigmoid --shared-experts 1 --capacity-factor 1.0 --aux-loss 0.001)
  serial_run "$variant" "${extra[@]}"
  for dp in 2 4 8; do
    for ep in 2 4; do
      [ $((dp % ep)) -eq 0 ] || continue
      layout_run "$variant" $dp "${variant}_dp${dp}_ep${ep}" --dp $dp --ep $ep "${extra[@]}"
      for zero in 1 2; do
        layout_run "$variant" $dp "${variant}_dp${dp}_ep${ep}_zero${zero}" --dp $dp --ep $ep --zero $zero "${extra[@]}"
      done
      layout_run "$variant" $dp "${variant}_dp${dp}_ep${ep}_recompute" --dp $dp --ep $ep --recompute full "${extra[@]}"
    done
  done
done
echo "moe_ep_matrix.sh: ok"
