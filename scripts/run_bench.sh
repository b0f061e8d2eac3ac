#!/usr/bin/env bash
# Runs every benchmark in build/bench. Each prints its ratios against a baseline it
# measures in the same run.
set -euo pipefail
build=${1:-build}
for b in "$build"/bench/bench_*; do
  [ -x "$b" ] || continue
  echo "== $(basename "$b") =="
  if [ -f "bench/$(basename "$b").sh" ]; then bash "bench/$(basename "$b").sh" "$b"; else "$b"; fi
done
echo "== bench_dp (ndmesh train) =="
bash bench/bench_dp.sh "$build/bin/ndmesh"
echo "== bench_zero3 (ZeRO-3 against ZeRO-2 step time, with and without prefetch) =="
bash bench/bench_zero3.sh "$build/bin/ndmesh"
echo "== bench_cp (ring attention, ndmesh train --cp) =="
bash bench/bench_cp.sh "$build"
echo "== bench_tp (ndmesh train) =="
bash bench/bench_tp.sh "$build/bin/ndmesh"
echo "== bench_pp (measured vs simulated pipeline bubble) =="
bash bench/bench_pp.sh "$build/bin/ndmesh"
echo "== bench_recompute (step time and activation bytes of --recompute) =="
bash bench/bench_recompute.sh "$build/bin/ndmesh"
echo "== bench_multinode (2 namespace nodes, shaped link; root only) =="
bash bench/bench_multinode.sh "$build"
