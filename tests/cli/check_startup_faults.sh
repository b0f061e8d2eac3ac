#!/usr/bin/env bash
# ndmesh check when the ranks are not started alike (mpirun MPMD): every rank must end at
# once with exit 2 and a message, not wait for the communication timeout (60 s here).
set -uo pipefail
export NDMESH_TIMEOUT_S=60
ndmesh=$1
mpirun=(mpirun --allow-run-as-root --oversubscribe)
fail() { echo "FAIL: $*"; exit 1; }

# Ranks 1-3 refuse their layout (dp*tp = 6 but 4 ranks); rank 0's is fine.
start=$(date +%s)
out=$(timeout 50 "${mpirun[@]}" -np 1 "$ndmesh" check --dp 2 --tp 2 : -np 3 "$ndmesh" check --dp 2 --tp 3 2>&1)
rc=$?
took=$(($(date +%s) - start))
echo "$out"
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "exit $rc, want a failure before the timeout"
[ $took -lt 30 ] || fail "took ${took} s: the ranks waited for the timeout"
[[ "$out" == *"world has 4 ranks"* ]] || fail "the refusing ranks' message is missing"
[[ "$out" == *"rank 1 refused its input"* ]] || fail "rank 0 does not say which rank refused"

# --ranks-per-node differs across ranks: part of the agreement.
start=$(date +%s)
out=$(timeout 50 "${mpirun[@]}" -np 2 "$ndmesh" check --dp 2 --tp 2 --ranks-per-node 4 : \
  -np 2 "$ndmesh" check --dp 2 --tp 2 --ranks-per-node 2 2>&1)
rc=$?
took=$(($(date +%s) - start))
echo "$out"
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "exit $rc, want a failure before the timeout"
[ $took -lt 30 ] || fail "took ${took} s"
[[ "$out" == *"disagree on --ranks-per-node (from 2 to 4"* ]] || fail "no disagreement message"
# A rank that never starts the engine (here `sleep`): the others would wait inside MPI_Init
# forever; NDMESH_INIT_TIMEOUT_S bounds it with one line and exit 124.
start=$(date +%s)
out=$(NDMESH_INIT_TIMEOUT_S=3 timeout 50 "${mpirun[@]}" -np 1 "$ndmesh" check --dp 2 : -np 1 sleep 40 2>&1)
rc=$?
took=$(($(date +%s) - start))
echo "$out" | head -3
[ $rc -ne 0 ] || fail "exit 0 with a rank that never started"
[ $took -lt 30 ] || fail "took ${took} s with NDMESH_INIT_TIMEOUT_S=3"
[[ "$out" == *"MPI_Init did not complete within 3 s"* ]] || fail "no start-up timeout message"
echo "ok"
