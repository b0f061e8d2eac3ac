#!/usr/bin/env bash
# MPI initialised by the host at MPI_THREAD_SERIALIZED before ndmesh (progress_probe
# serialized): the run works, and says once that the progress thread is off.
#   host_mpi_serialized.sh <mpirun command...> <path to progress_probe>
set -u
out=$("$@" serialized 2>&1)
rc=$?
fail() { echo "host_mpi_serialized.sh: $1"; echo "$out"; exit 1; }
[ "$rc" -eq 0 ] || fail "exit $rc"
case "$out" in *skipped:*) echo "$out"; exit 0 ;; esac
[[ "$out" == *ok* ]] || fail "no ok"
line="[rank 0] warning: [dp] MPI provides MPI_THREAD_SERIALIZED (MPI was initialised by the host program before ndmesh): the data-parallel progress thread is off (it needs MPI_THREAD_MULTIPLE); the reductions progress only in the model's hooks"
[ "$(grep -cF -- "$line" <<< "$out")" -eq 1 ] || fail "expected the line once: $line"
[ "$(grep -c "progress thread is off" <<< "$out")" -eq 1 ] || fail "the line is not said exactly once per run"
echo "host_mpi_serialized.sh: ok"
