#!/usr/bin/env bash
# Runs bench_comm under mpirun: the communicator set-up on the 16-rank mesh, then the
# all_reduce overhead on 2 ranks (one per core of this machine).
#   bench/bench_comm.sh <path of bench_comm>
set -euo pipefail
exe=$1
mpirun=(mpirun --allow-run-as-root --oversubscribe)
echo "-- 16 ranks: single-dim communicators of dp2 pp2 cp2 tp2"
"${mpirun[@]}" -np 16 "$exe" --benchmark_filter='BM_Split'
echo "-- 2 ranks: all_reduce of float32"
"${mpirun[@]}" -np 2 "$exe" --benchmark_filter='BM_AllReduce'
