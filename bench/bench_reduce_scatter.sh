#!/usr/bin/env bash
# Gloo's reduce-scatter (ReduceScatterHalvingDoubling) against an all-reduce and a copy of
# this rank's block, in the same run, on 4 ranks under `ndmesh launch --store`, float32:
# the ratio is the all-reduce's time over the reduce-scatter's (above 1: the
# reduce-scatter is faster).
#   bench/bench_reduce_scatter.sh <path of bench_reduce_scatter> [ndmesh] [ranks]
set -euo pipefail
exe=$1
build=$(cd "$(dirname "$exe")/.." && pwd)
ndmesh=${2:-$build/bin/ndmesh}
ranks=${3:-4}
echo "-- reduce-scatter vs all-reduce + copy, $ranks ranks, Gloo (ndmesh launch --store), float32"
printf "  %10s %14s %14s %8s\n" "input B" "reduce_scatter" "all_reduce+cp" ratio
"$ndmesh" launch --store --no-tag -n "$ranks" -- "$exe" ${4:+"$4"} | jq -r 'select(.bytes != null)
  | "\(.bytes) \(.reduce_scatter_s) \(.all_reduce_copy_s) \(.ratio)"' |
  awk '{printf "  %10d %11.1f us %11.1f us %8.2f\n", $1, $2 * 1e6, $3 * 1e6, $4}'
