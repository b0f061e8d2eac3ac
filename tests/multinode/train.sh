#!/usr/bin/env bash
# Training across two real nodes (tests/multinode/harness.sh) equals the serial run: dp x tp
# with tp inside each node and dp across, pp x dp with the pipeline across the nodes, and
# dp with the hierarchical all-reduce on the real nodes (no --ranks-per-node), within the
# bounds of every equivalence test (tests/support/compare_runs.sh); then the all-reduce algorithms'
# own tests (exact against MPI) on 2 nodes x 2 and x 3 ranks.
#   train.sh <path to ndmesh> <path to mpi_test_allreduce>
source "$(dirname "$0")/mn_lib.sh" "$@"
allreduce_test=$2
export NDMESH_TIMEOUT_S=60
model=(--layers 2 --hidden 32 --heads 4 --kv-heads 2 --seq 16 --markov-vocab 16 --threads 1 --eval-batches 0
  --warmup 2 --batch 8 --steps 6 --json)
"$ndmesh" train "${model[@]}" | tail -n 1 > "$tmp/serial.json" || fail "serial run: exit $?"
# The comparison every equivalence test uses (expect_same; both runs must have their numbers).
source "$(dirname "$0")/../support/compare_runs.sh"
expect_numbers "serial" "$tmp/serial.json" 6

mn_cluster c --nodes 2 --ranks 2
check() {  # check <name> <train flags...>
  local name=$1
  shift
  mn_once_more "$tmp/run.out" mn_mpirun "$c" -np 4 "$ndmesh" train "${model[@]}" "$@" || fail "$name: exit $?: $(tail "$tmp/run.out")"
  tail -n 1 "$tmp/run.out" > "$tmp/run.json"
  expect_numbers "$name" "$tmp/run.json" 6
  expect_same "$name on 2 nodes" "$tmp/serial.json" "$tmp/run.json"
}
check "dp 2 x tp 2 (sequence parallel)" --dp 2 --tp 2 --sequence-parallel
check "pp 2 (across nodes) x dp 2, 1f1b" --pp 2 --dp 2 --order pp,dp,cp,tp --micro-batch 2
check "dp 4, hierarchical all-reduce on the real nodes" --dp 4 --allreduce hierarchical --bucket-mb 0.01
grep -q "all-reduce hierarchical" "$tmp/run.out" || fail "the run does not say it used the hierarchical all-reduce"

# The all-reduce algorithms against MPI and closed forms, hierarchical on the real nodes.
mn_once_more "$tmp/ar.out" mn_mpirun "$c" -np 4 "$allreduce_test" || fail "all-reduce tests on 2x2: $(tail -n 30 "$tmp/ar.out")"
grep -q "PASSED" "$tmp/ar.out" || fail "all-reduce tests on 2x2 did not pass"
mn_down "$c"
mn_cluster c --nodes 2 --ranks 3
mn_once_more "$tmp/ar.out" mn_mpirun "$c" -np 6 "$allreduce_test" || fail "all-reduce tests on 2x3: $(tail -n 30 "$tmp/ar.out")"
grep -q "PASSED" "$tmp/ar.out" || fail "all-reduce tests on 2x3 did not pass"
echo "train.sh: ok"
