#!/usr/bin/env bash
# Launches without mpirun, in both store modes: ndmesh check verifies every group kind by
# communication on 4 and 8 ranks, seed 000's program prints the seed's lines, two launcher
# invocations act as two nodes, and the ranks say which store protocol they spoke (v1 to
# Debian's PyTorch 1.13 TCPStore served by the launcher's agent, v2 to ndmesh's own).
#   store_modes.sh <ndmesh> <parallel_config> <launcher command...>
# The launcher command is `python3 tests/store/torchrun_env.py [--agent-store]`.
set -uo pipefail
ndmesh=$1 parallel_config=$2
shift 2
run=("$@")
here=$(dirname "$0")
fail() { echo "FAIL: $*" >&2; exit 1; }
[[ " ${run[*]} " == *" --agent-store "* ]] && want=v1 || want=v2
{
  for layout in "--tp 2 --dp 2" "--dp 2 --pp 2 --tp 2"; do
    np=$(( $(echo "$layout" | tr -cd '0-9 ' | tr ' ' '\n' | grep -v '^$' | paste -sd'*' | bc) ))
    out=$(NDMESH_LOG=debug "${run[@]}" -np "$np" "$ndmesh" check $layout 2>&1) || fail "check $layout: $out"
    grep -q "all match the mesh" <<< "$out" || fail "check $layout did not verify: $out"
    n=$(grep -c "ranks met at .* (c10d protocol $want)" <<< "$out")
    [ "$n" -eq "$np" ] || fail "$n of $np ranks spoke c10d protocol $want: $out"
    echo "check $layout on $np ranks: verified over gloo, c10d protocol $want"
  done
  bash "$here/../mpi/parallel_config_seed000.sh" "${run[@]}" -np 4 "$parallel_config" > /dev/null ||
    fail "seed 000's program: $(bash "$here/../mpi/parallel_config_seed000.sh" "${run[@]}" -np 4 "$parallel_config" 2>&1 | tail -3)"
  echo "seed 000's program printed the seed's lines"
  # Two nodes of 2 ranks: two launcher invocations with --nnodes 2 and the same master.
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "${run[@]}" --nnodes 2 --node-rank 1 --master-port "$port" -np 2 "$ndmesh" check --tp 2 --dp 2 > /tmp/ndmesh_node1.$$ 2>&1 &
  node1=$!
  out=$("${run[@]}" --nnodes 2 --node-rank 0 --master-port "$port" -np 2 "$ndmesh" check --tp 2 --dp 2 2>&1) ||
    fail "two nodes, node 0: $out"
  wait "$node1" || fail "two nodes, node 1: $(cat /tmp/ndmesh_node1.$$)"
  rm -f /tmp/ndmesh_node1.$$
  grep -q "all match the mesh" <<< "$out" || fail "two nodes did not verify: $out"
  grep -q "2 nodes" <<< "$out" || fail "the check did not see 2 nodes: $out"
  echo "two launcher invocations (--nnodes 2): verified as 2 nodes"
}
echo PASS
