#!/usr/bin/env bash
# Bus bandwidth of every all-reduce algorithm against MPI_Allreduce on 8 ranks, 4 B to
# 64 MiB (ratios from the same run; see bench_allreduce.cpp).
#   bench/bench_allreduce.sh <path of bench_allreduce> [seconds per size and algorithm]
set -euo pipefail
exe=$1
mpirun=(mpirun --allow-run-as-root --oversubscribe)
"${mpirun[@]}" -np "${NDMESH_BENCH_RANKS:-8}" "$exe" "${2:-0.3}"
