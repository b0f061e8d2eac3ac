#!/usr/bin/env bash
# --device cuda on several ranks where no GPU is (this machine, CI): every rank that ends by
# itself ends with its one line saying why CUDA cannot run (no GPU here, or a build without CUDA) and the job exits
# non-zero within seconds: under mpirun, under the store launch (NCCL over the Gloo
# bootstrap), and staged over Gloo (NDMESH_BACKEND=gloo). Several GPU ranks are no longer
# refused as "not available".
set -uo pipefail
export NDMESH_TIMEOUT_S=${NDMESH_TIMEOUT_S:-60}
ndmesh=$1
fail() { echo "FAIL: $*"; exit 1; }
model=(train --device cuda --dp 2 --steps 2 --layers 1 --hidden 16 --heads 2 --seq 8 --batch 2)

# check <what> <env...> -- <launch args...>
check() {
  local what=$1 out rc start elapsed
  shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  start=$(date +%s)
  out=$(env "${envs[@]}" timeout 120 "$ndmesh" launch "$@" -- "$ndmesh" "${model[@]}" 2>&1)
  rc=$?
  elapsed=$(( $(date +%s) - start ))
  [ "$rc" -ne 0 ] || fail "$what: exit 0: $out"
  [ "$rc" -ne 124 ] || fail "$what: hung (timeout): $out"
  [ "$elapsed" -lt 60 ] || fail "$what: took $elapsed s"
  ! grep -q "not available yet" <<< "$out" || fail "$what: several GPU ranks still refused: $out"
  # Each rank that says anything says why CUDA cannot run, never that a peer's store or group
  # went away. Usually both ranks print it; under load the launcher may end the slower rank
  # (its sibling failed first) before it gets there, so one line is enough, none is not.
  local lines others
  lines=$(grep -E '\[cuda\] (no usable CUDA GPU here|the CUDA driver sees no GPU|this ndmesh was built without CUDA)' <<< "$out")
  [ -n "$lines" ] || fail "$what: no rank said why CUDA cannot run: $out"
  others=$(grep -E 'ndmesh: \[rank [0-9]+\]' <<< "$out" | grep -vF "$lines" || true)
  [ -z "$others" ] || fail "$what: a rank ended with another error than the [cuda] line: $others"
  echo "ok $what (exit $rc, ${elapsed} s): $(head -n 1 <<< "$lines")"
}

check "store launch (nccl)" NDMESH_X=1 -- --store -n 2
check "store launch, staged over gloo" NDMESH_BACKEND=gloo -- --store -n 2
check "mpirun" NDMESH_X=1 -- -n 2
check "mpirun, staged over mpi" NDMESH_BACKEND=mpi -- -n 2
echo PASS
