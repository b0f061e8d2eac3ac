#!/usr/bin/env bash
# Step time of tensor parallelism (one BLAS thread per rank) against the serial run with
# one thread, measured in the same run on a model wide enough that the matrix products
# dominate (hidden 512): tp 1, 2 and 4 with and without sequence parallelism, the ratio
# to serial, and the time per step spent inside tp collectives (slowest rank; blocking
# calls, so waiting for a slower peer counts too). Ranks beyond the machine's cores share
# them, so those ratios say little; the script says when that happens.
#   bench/bench_tp.sh <path of ndmesh> [steps]
set -euo pipefail
ndmesh=$1
steps=${2:-8}
mpirun=(mpirun --allow-run-as-root --oversubscribe)
model=(--layers 2 --hidden 512 --heads 8 --kv-heads 8 --seq 128 --batch 8 --markov-vocab 64 --threads 1
  --eval-batches 0 --steps "$steps" --warmup 2 --json)
cores=$(nproc)
serial=$("$ndmesh" train "${model[@]}" | tail -n 1)
base=$(jq -r .step_seconds <<<"$serial")
echo "tp benchmark: 2 layers, hidden 512, 8 heads, seq 128, batch 8, $steps steps, 1 BLAS thread per rank, $cores cores"
printf "  %-22s step %.4f s  ratio 1.000\n" "serial" "$base"
for layout in "1 --tp 1" "2 --tp 2" "2 --tp 2 --sequence-parallel" "4 --tp 4" "4 --tp 4 --sequence-parallel"; do
  set -- $layout
  np=$1
  shift
  out=$("${mpirun[@]}" -np "$np" "$ndmesh" train "${model[@]}" "$@" | tail -n 1)
  awk -v s="$(jq -r .step_seconds <<<"$out")" -v c="$(jq -r .tp_comm_seconds <<<"$out")" -v b="$base" \
    -v name="$*" -v mb="$(jq '[.tp_comm_per_step[].bytes] | add / 1048576' <<<"$out")" \
    -v over="$([ "$np" -gt "$cores" ] && echo " (oversubscribed: $np ranks on $cores cores)")" 'BEGIN{
    printf "  %-28s step %.4f s  ratio %.3f  tp communication %.4f s/step (%.0f%%), %.1f MiB/step%s\n",
           name, s, s / b, c, 100 * c / s, mb, over
  }'
done
echo "  target: tp 2 at most 0.65x serial"
