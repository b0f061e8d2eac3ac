#!/usr/bin/env bash
# ndmesh check under mpirun: summaries, JSON, an injected fault, bad layouts, torchrun.
set -uo pipefail
# A rank that hangs ends the job in a minute, well inside the test's timeout.
export NDMESH_TIMEOUT_S=${NDMESH_TIMEOUT_S:-60}
ndmesh=$1
mpirun=(mpirun --allow-run-as-root --oversubscribe)
fail() { echo "FAIL: $*"; exit 1; }

# 4D layouts on 8 ranks; the number of groups of each kind is world / group size, summed
# over the kinds by hand: dp2 pp2 tp2 (cp1): 4 + 4 + 8 + 4 = 20.
out=$("${mpirun[@]}" -np 8 "$ndmesh" check --dp 2 --pp 2 --tp 2 2>&1) || fail "exit $?: $out"
echo "$out"
[[ "$out" == *"mesh dp=2,pp=2,cp=1,tp=2 on 8 ranks"* ]] || fail "no mesh line"
[[ "$out" == *"verified 20 groups: all match the mesh"* ]] || fail "expected 20 groups"

# JSON: one line; kinds tp, dp-cp (cp=2, dp=1: 4 groups of 2), pp-tp (2 groups of 4):
# 4 + 4 + 2 = 10 groups; dp-cp shares cp's members but no split is made twice.
out=$("${mpirun[@]}" -np 8 "$ndmesh" check --pp 2 --cp 2 --tp 2 --groups tp,dp-cp,pp-tp --json 2>&1) ||
  fail "exit $?: $out"
echo "$out"
[ "$(echo "$out" | grep -c '^{')" -eq 1 ] || fail "expected exactly one JSON line"
[[ "$out" == *'"setup_seconds":'* ]] || fail "no setup_seconds"
[[ "$out" == *'"groups_verified":10,'* ]] || fail "expected groups_verified 10"
[[ "$out" == *'"ok":true'* ]] || fail "not ok"

# --ranks-per-node against where mpirun really put the ranks (all on this one node).
out=$("${mpirun[@]}" -np 4 "$ndmesh" check --dp 2 --tp 2 --ranks-per-node 4 --json 2>&1) || fail "exit $?: $out"
[[ "$out" == *'"placement_as_assumed":true'* ]] || fail "4 ranks on one node should match --ranks-per-node 4: $out"
out=$("${mpirun[@]}" -np 4 "$ndmesh" check --dp 2 --tp 2 --ranks-per-node 2 2>&1) || fail "exit $?: $out"
[[ "$out" == *"warning: --ranks-per-node 2 assumes"*"(1 node here)"* ]] || fail "no placement warning: $out"

# Non-default order with 16 ranks: tp outermost.
out=$("${mpirun[@]}" -np 16 "$ndmesh" check --tp 2 --pp 2 --dp 4 --order tp,pp,dp,cp --json 2>&1) ||
  fail "exit $?: $out"
[[ "$out" == *'"mesh":"tp=2,pp=2,dp=4,cp=1"'* && *'"ok":true'* ]] || fail "16 ranks: $out"

# A rank that reports a wrong rank: mismatches found, exit non-zero.
out=$("${mpirun[@]}" -np 4 "$ndmesh" check --dp 2 --tp 2 --fault-rank 1 2>&1)
rc=$?
echo "$out" | head -12
[ "$rc" -ne 0 ] || fail "an injected fault passed"
[[ "$out" == *"FAILED: "*" groups do not match the mesh"* ]] || fail "no FAILED line"

# A layout for another world size: exit 2 naming the sizes.
out=$("${mpirun[@]}" -np 4 "$ndmesh" check --dp 2 --pp 2 --tp 2 2>&1)
rc=$?
[ "$rc" -eq 2 ] || fail "wrong world: exit $rc, expected 2"
[[ "$out" == *"8 but the world has 4 ranks"* ]] || fail "unclear message: $out"

# One rank started with another order (MPMD): every rank fails cleanly, naming rank 3.
out=$("${mpirun[@]}" -np 3 "$ndmesh" check --dp 2 --tp 2 : -np 1 "$ndmesh" check --dp 2 --tp 2 --order tp,dp,pp,cp 2>&1)
rc=$?
[ "$rc" -eq 2 ] || fail "disagreeing mesh: exit $rc, expected 2"
[[ "$out" == *"the ranks disagree on the mesh and groups: ranks 0-2 have dp=2,pp=1,cp=1,tp=2"*"but rank 3 has tp=2,dp=2"* ]] ||
  fail "unclear message: $out"

# RANK and WORLD_SIZE without MASTER_ADDR/MASTER_PORT (as by torchrun, but no store to meet
# at): exit 2 naming the missing variable and how to launch instead.
out=$(env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 "$ndmesh" check --tp 2 2>&1)
rc=$?
echo "$out"
[ "$rc" -eq 2 ] || fail "torchrun: exit $rc, expected 2"
[[ "$out" == *"but MASTER_ADDR is not"*"mpirun -np 2"*"srun --mpi=pmix -n 2"*"ndmesh launch -n 2 --"* ]] ||
  fail "unclear torchrun message"
echo PASS
