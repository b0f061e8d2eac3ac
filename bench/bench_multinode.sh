#!/usr/bin/env bash
# The all-reduce algorithms and data-parallel training on two real nodes of this machine
# (tests/multinode/harness.sh: network namespaces, Open MPI's shared memory inside a node
# and TCP between nodes), the inter-node link shaped to RATE at each node's egress:
#  1. bench_allreduce's table (bus bandwidth of MPI_Allreduce, and of ring, tree,
#     hierarchical and adaptive as ratios to it; hier/ring) on 2 nodes x 2 and x 4 ranks,
#     the node split taken from the launcher (--ranks-per-node 0);
#  2. `ndmesh train --dp 4` step time with --allreduce hierarchical against ring, A/B
#     interleaved, median of per-pair ratios.
# Root only (prints why and exits 0 elsewhere). Ratios come from the same run.
#   bench/bench_multinode.sh <build dir> [rate, default 1gbit] [seconds per size, default 0.3]
set -uo pipefail
build=$(cd "${1:-build}" && pwd)
rate=${2:-1gbit}
seconds=${3:-0.3}
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../tests/multinode/harness.sh"
if ! reason=$(mn_probe); then
  echo "bench_multinode: skipped: $reason"
  exit 0
fi
export NDMESH_TIMEOUT_S=300
clusters=()
trap 'for c in "${clusters[@]}"; do mn_down "$c"; done' EXIT

for ranks in 2 4; do
  c=$(mn_up --nodes 2 --ranks "$ranks" --rate "$rate") || exit 1
  clusters+=("$c")
  echo "-- 2 nodes x $ranks ranks, link $rate per direction (tbf at each node's egress)"
  mn_mpirun "$c" -np $((2 * ranks)) "$build/bench/bench_allreduce" "$seconds" --ranks-per-node 0 \
    --min-bytes 1024 --max-bytes $((16 << 20))
  mn_down "$c"
done

# dp 4 on 2 nodes x 2: gradients of 8.4 MB (2.1 M parameters) per step.
c=$(mn_up --nodes 2 --ranks 2 --rate "$rate") || exit 1
clusters+=("$c")
model=(--layers 4 --hidden 192 --heads 4 --seq 16 --markov-vocab 64 --threads 1 --eval-batches 0 --batch 4
  --steps 12 --warmup 2 --dp 4 --bucket-mb 4 --json)
step() {  # step <algorithm>: seconds per step of one run
  mn_mpirun "$c" -np 4 "$build/bin/ndmesh" train "${model[@]}" --allreduce "$1" 2> /dev/null | tail -n 1 |
    jq .step_seconds
}
ratios=()
for round in 1 2 3 4 5; do
  ring=$(step ring)
  hier=$(step hierarchical)
  ratios+=("$(awk -v r="$ring" -v h="$hier" 'BEGIN{printf "%.3f", h / r}')")
  echo "  round $round: step time ring $ring s, hierarchical $hier s"
done
median=$(printf '%s\n' "${ratios[@]}" | sort -n | sed -n 3p)
echo "-- dp 4 on 2 nodes x 2, link $rate: step time hierarchical / ring: median $median (rounds: ${ratios[*]})"
