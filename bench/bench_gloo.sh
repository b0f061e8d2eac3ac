#!/usr/bin/env bash
# Gloo (a launch with torchrun's variables, tests/store/torchrun_env.py) against MPI
# (mpirun), measured in the same run, as ratios gloo / mpi:
#   - group set-up on 8 ranks: ndmesh check --dp 2 --pp 2 --tp 2 (ProcessGroups' splits,
#     its setup_seconds; the median of 3 runs each, interleaved);
#   - all-reduce bus bandwidth on 2 ranks (one per core), float32, 4 B .. 64 MiB;
#   - dp 4 step time of ndmesh train (median of 2 runs each, interleaved).
#   bench/bench_gloo.sh <path of bench_gloo> [ndmesh]
set -euo pipefail
exe=$1
build=$(cd "$(dirname "$exe")/.." && pwd)
ndmesh=${2:-$build/bin/ndmesh}
here=$(cd "$(dirname "$0")" && pwd)
mpirun=(mpirun --allow-run-as-root --oversubscribe)
store=(python3 "$here/../tests/store/torchrun_env.py")
median() { sort -g | awk '{v[NR]=$1} END{print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }

echo "-- group set-up, 8 ranks, ndmesh check --dp 2 --pp 2 --tp 2 (setup_seconds, median of 3)"
for i in 1 2 3; do
  "${mpirun[@]}" -np 8 "$ndmesh" check --dp 2 --pp 2 --tp 2 --json | tail -n 1 | jq .setup_seconds >> /tmp/bg_mpi.$$
  "${store[@]}" -np 8 "$ndmesh" check --dp 2 --pp 2 --tp 2 --json | tail -n 1 | jq .setup_seconds >> /tmp/bg_gloo.$$
done
m=$(median < /tmp/bg_mpi.$$) g=$(median < /tmp/bg_gloo.$$)
rm -f /tmp/bg_mpi.$$ /tmp/bg_gloo.$$
awk -v m="$m" -v g="$g" 'BEGIN{printf "  mpi %.4f s, gloo %.4f s: gloo / mpi %.2f\n", m, g, g / m}'

echo "-- all-reduce bus bandwidth, 2 ranks, float32 (GB/s, nccl-tests convention)"
"${mpirun[@]}" -np 2 "$exe" > /tmp/bg_mpi.$$
"${store[@]}" -np 2 "$exe" > /tmp/bg_gloo.$$
printf "  %10s %10s %10s %12s %12s %9s\n" bytes "mpi us" "gloo us" "mpi GB/s" "gloo GB/s" gloo/mpi
jq -n -r --slurpfile m /tmp/bg_mpi.$$ --slurpfile g /tmp/bg_gloo.$$ '[$m, $g] | transpose | .[]
          | select(.[0] != null and .[1] != null)
          | "\(.[0].bytes) \(.[0].seconds) \(.[1].seconds) \(.[0].busbw_gbps) \(.[1].busbw_gbps)"' |
  awk '{printf "  %10d %10.1f %10.1f %12.4g %12.4g %9.3f\n", $1, $2 * 1e6, $3 * 1e6, $4, $5, $2 / $3}'
echo "  (gloo/mpi: ratio of bus bandwidths, = mpi time / gloo time; above 1: gloo is faster)"
rm -f /tmp/bg_mpi.$$ /tmp/bg_gloo.$$

echo "-- dp 4 step time, ndmesh train (4 ranks on 2 cores, median of 2)"
model=(--layers 4 --hidden 128 --heads 4 --seq 64 --markov-vocab 32 --threads 1 --eval-batches 0 --steps 20
  --warmup 2 --batch 16 --dp 4 --json)
for i in 1 2; do
  "${mpirun[@]}" -np 4 "$ndmesh" train "${model[@]}" 2> /dev/null | tail -n 1 | jq .step_seconds >> /tmp/bg_mpi.$$
  "${store[@]}" -np 4 "$ndmesh" train "${model[@]}" 2> /dev/null | tail -n 1 | jq .step_seconds >> /tmp/bg_gloo.$$
done
m=$(median < /tmp/bg_mpi.$$) g=$(median < /tmp/bg_gloo.$$)
rm -f /tmp/bg_mpi.$$ /tmp/bg_gloo.$$
awk -v m="$m" -v g="$g" 'BEGIN{printf "  mpi %.4f s, gloo %.4f s: gloo / mpi %.2f\n", m, g, g / m}'
