#!/usr/bin/env bash
# Context parallelism: attention work per rank (zigzag vs contiguous, max/mean), the
# fraction of the ring's transfers hidden behind the attention compute (bench_ring_overlap,
# which measures the same transfers alone in the same run),
# and the training step time for cp 1, 2, 4 at seq 2048 against cp 1 (same run).
#   bench/bench_cp.sh <build dir> [steps]
# More ranks than cores distort the timings: cp 4 on a 2-core machine is oversubscribed.
set -euo pipefail
build=$1
steps=${2:-5}
ndmesh=$build/bin/ndmesh
ring=$build/tests/mpi_test_ring_attention
overlap=$build/bench/bench_ring_overlap
mpirun=(mpirun --allow-run-as-root --oversubscribe)
for np in 2 4; do
  "${mpirun[@]}" -np "$np" "$ring" --gtest_filter='RingAttentionBalance.*' | grep -E '^cp [0-9]' || true
  "${mpirun[@]}" -np "$np" "$overlap"
done
model=(--layers 2 --hidden 64 --heads 4 --seq 2048 --batch 4 --markov-vocab 32 --threads 1 --eval-batches 0
  --steps "$steps" --warmup 1 --json)
one=$("$ndmesh" train "${model[@]}" | tail -n 1 | jq '.step_seconds')
echo "train seq 2048, 2 layers hidden 64, batch 4, $steps steps: cp 1 step $one s"
for cp in 2 4; do
  t=$("${mpirun[@]}" -np "$cp" "$ndmesh" train "${model[@]}" --cp "$cp" | tail -n 1 | jq '.step_seconds')
  awk -v t="$t" -v one="$one" -v cp="$cp" 'BEGIN{printf "  cp %d step %.4f s = %.3f x cp 1 (ideal %.3f)\n", cp, t, t / one, 1 / cp}'
done
