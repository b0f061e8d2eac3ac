#!/usr/bin/env bash
# The Gloo backend's reduce-scatter algorithms against an all-reduce and a copy of this
# rank's block, measured in the same run (bench_reduce_scatter.cpp), float32, on 2, 3
# and 4 ranks under `ndmesh launch --store`: each ratio is the baseline's time over the
# algorithm's (above 1: faster than all-reduce + copy).
#   bench/bench_reduce_scatter.sh <path of bench_reduce_scatter> [ndmesh] [max input bytes]
set -euo pipefail
exe=$1
build=$(cd "$(dirname "$exe")/.." && pwd)
ndmesh=${2:-$build/bin/ndmesh}
for ranks in 2 3 4; do
  echo "-- reduce-scatter on $ranks ranks, Gloo (ndmesh launch --store), float32; ratio = all-reduce+copy / algorithm"
  printf "  %10s %14s %14s %8s %14s %8s\n" "input B" "all_reduce+cp" "halving-doubl" ratio ring ratio
  "$ndmesh" launch --store --no-tag -n "$ranks" -- "$exe" ${3:+"$3"} | jq -r 'select(.bytes != null)
    | "\(.bytes) \(.all_reduce_copy_s) \(.halving_doubling_s) \(.halving_doubling_ratio) \(.ring_s) \(.ring_ratio)"' |
    awk '{printf "  %10d %11.1f us %11.1f us %8.2f %11.1f us %8.2f\n", $1, $2 * 1e6, $3 * 1e6, $4, $5 * 1e6, $6}'
done
