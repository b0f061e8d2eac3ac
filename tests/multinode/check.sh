#!/usr/bin/env bash
# Node-aware behaviour on real nodes (two network namespaces, tests/multinode/harness.sh):
# the node count and placement come from the launcher (no --ranks-per-node), `ndmesh check`
# verifies every group kind, reports which kinds cross nodes (closed form: Open MPI fills
# node0's slots first, so rank r is on node r / ranks-per-node) and warns when tp does;
# --ranks-per-node matching the real placement is confirmed, a wrong one warned about.
#   check.sh <path to ndmesh>
source "$(dirname "$0")/mn_lib.sh" "$@"
export NDMESH_TIMEOUT_S=60

# crossing <json> <kind>: "groups_crossing_nodes max_nodes_spanned" of a kind.
crossing() { jq -r --arg k "$2" '.kinds[] | select(.kind == $k) | "\(.groups_crossing_nodes) \(.max_nodes_spanned)"' <<<"$1"; }

# 2 nodes x 2 ranks, dp 2 x tp 2 (tp innermost): dp groups {0,2},{1,3} cross, tp {0,1},{2,3} do not.
mn_cluster c22 --nodes 2 --ranks 2
out=$(mn_mpirun "$c22" -np 4 "$ndmesh" check --dp 2 --tp 2 --groups dp,tp,pp,cp,dp-tp,dp-pp,pp-tp,dp-pp-cp-tp --json) ||
  fail "check on 2x2 exited $?: $out"
echo "$out"
json=$(grep '^{' <<<"$out")
[ "$(jq -r '"\(.nodes) \(.launcher) \(.ok) \(.groups_verified)"' <<<"$json")" = "2 openmpi true 18" ] ||
  fail "2x2: expected 2 nodes (openmpi), ok, 18 groups verified"
[ "$(crossing "$json" dp)" = "2 2" ] || fail "2x2: dp groups should both cross the 2 nodes"
[ "$(crossing "$json" tp)" = "0 1" ] || fail "2x2: tp groups should stay inside a node"
[ "$(crossing "$json" pp)" = "0 1" ] || fail "2x2: pp (size 1) inside a node"
[ "$(crossing "$json" dp-pp-cp-tp)" = "1 2" ] || fail "2x2: the world group spans 2 nodes"
[ "$(jq '.warnings | length' <<<"$json")" = 0 ] || fail "2x2: no warning expected with tp inside nodes"

# The same layout with tp outermost: tp crosses nodes, and the check says so.
out=$(mn_mpirun "$c22" -np 4 "$ndmesh" check --dp 2 --tp 2 --order tp,dp,pp,cp 2>&1) || fail "exit $?: $out"
echo "$out"
grep -q "^  tp           2 of 2 groups cross nodes (up to 2 nodes each)" <<<"$out" || fail "no tp crossing line"
grep -q "^warning: tp groups cross node boundaries (2 of 2 groups, up to 2 nodes each)" <<<"$out" ||
  fail "no warning for tp across nodes"

# --ranks-per-node: right (2) confirmed, wrong (4: one node assumed) warned about.
out=$(mn_mpirun "$c22" -np 4 "$ndmesh" check --dp 2 --tp 2 --ranks-per-node 2 --json) || fail "exit $?"
[ "$(grep '^{' <<<"$out" | jq .placement_as_assumed)" = true ] || fail "--ranks-per-node 2 is the real placement: $out"
out=$(mn_mpirun "$c22" -np 4 "$ndmesh" check --dp 2 --tp 2 --ranks-per-node 4 2>&1) || fail "exit $?"
grep -q "^warning: --ranks-per-node 4 assumes ranks fill nodes 4 at a time, but the launcher placed them otherwise (2 nodes here)" \
  <<<"$out" || fail "no warning for a wrong --ranks-per-node: $out"

# ndmesh launch on the head node with the cluster's mpirun options, rank-tagged output.
out=$(mn_launch "$c22" "$ndmesh" -n 4 -- "$ndmesh" check --tp 2 --dp 2 2>&1) || fail "ndmesh launch exited $?: $out"
grep -q "^\[1,0\]<stdout>:ndmesh check: mesh dp=2,pp=1,cp=1,tp=2 on 4 ranks, 2 nodes" <<<"$out" ||
  fail "ndmesh launch: no 2-node summary: $out"

# 2 nodes x 4 ranks, dp 2 x pp 2 x tp 2: tp {0,1} and pp {0,2} inside node0, dp {0,4} across.
mn_down "$c22"
mn_cluster c24 --nodes 2 --ranks 4
out=$(mn_mpirun "$c24" -np 8 "$ndmesh" check --dp 2 --pp 2 --tp 2 --groups dp,pp,tp,dp-pp,dp-tp,pp-tp,dp-pp-tp --json) ||
  fail "check on 2x4 exited $?: $out"
echo "$out"
json=$(grep '^{' <<<"$out")
[ "$(jq -r '"\(.nodes) \(.ok) \(.groups_verified)"' <<<"$json")" = "2 true 19" ] || fail "2x4: expected 2 nodes, 19 groups"
[ "$(crossing "$json" dp)" = "4 2" ] || fail "2x4: every dp group crosses"
[ "$(crossing "$json" pp)" = "0 1" ] || fail "2x4: pp inside nodes"
[ "$(crossing "$json" tp)" = "0 1" ] || fail "2x4: tp inside nodes"
[ "$(crossing "$json" pp-tp)" = "0 1" ] || fail "2x4: pp-tp (4 ranks) is one node each"
[ "$(crossing "$json" dp-tp)" = "2 2" ] || fail "2x4: dp-tp crosses"
echo "check.sh: ok"
