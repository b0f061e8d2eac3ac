#!/usr/bin/env bash
# A mixture of experts' token dispatch and combine, all-to-all-v (nn::Moe's) against the
# all-gather dispatcher, on the same routing in one run (bench_moe_dispatch.cpp), on 2 and 4
# ranks under mpirun: 1024 tokens per rank, 8 experts top-2, widths 64, 256 and 1024; the
# ratio is the all-gather time over the all-to-all-v time (above 1: all-to-all-v is faster).
#   bench/bench_moe_dispatch.sh <path of bench_moe_dispatch> [tokens per rank]
set -euo pipefail
exe=$1
for ranks in 2 4; do
  echo "-- MoE dispatch + combine on $ranks ranks (MPI), ${2:-1024} tokens per rank, 8 experts top-2; ratio = all-gather / all-to-all-v"
  printf "  %8s %14s %14s %8s\n" channels all_to_all_v all_gather ratio
  mpirun --allow-run-as-root --oversubscribe -np "$ranks" "$exe" ${2:+"$2"} | jq -r 'select(.channels != null)
    | "\(.channels) \(.all_to_all_v_s) \(.all_gather_s) \(.ratio)"' |
    awk '{printf "  %8d %11.1f us %11.1f us %8.2f\n", $1, $2 * 1e6, $3 * 1e6, $4}'
done
