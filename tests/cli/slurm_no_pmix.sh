#!/usr/bin/env bash
# A direct launch by srun without PMIx (plain `srun -n 4` where slurm.conf has no
# MpiDefault=pmix) ends before MPI_Init with one line naming the fix, not Open MPI's page of
# text (77 lines per task): each rank is started here with the variables srun gives a task (faked; no Slurm
# needed), none of PMIx's. With PMIx's variables, or one task, the check lets MPI start.
#   slurm_no_pmix.sh <ndmesh>
set -uo pipefail
ndmesh=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
srun_task() {  # <rank> <tasks> command...: the environment of a task of `srun -n <tasks>`
  local rank=$1 n=$2
  shift 2
  env SLURM_JOB_ID=4242 SLURM_JOBID=4242 SLURM_STEP_ID=0 SLURM_STEPID=0 SLURM_PROCID="$rank" \
    SLURM_LOCALID="$rank" SLURM_NODEID=0 SLURM_NTASKS="$n" SLURM_NPROCS="$n" SLURM_STEP_NUM_TASKS="$n" \
    SLURM_STEP_NUM_NODES=1 SLURM_NNODES=1 SLURM_JOB_NUM_NODES=1 SLURM_NODELIST="$(hostname)" \
    SLURM_STEP_NODELIST="$(hostname)" SLURM_JOB_NODELIST="$(hostname)" SLURM_TASKS_PER_NODE="$n" \
    SLURM_STEP_TASKS_PER_NODE="$n" SLURM_CPUS_ON_NODE=2 SLURM_SRUN_COMM_HOST=127.0.0.1 \
    SLURM_SRUN_COMM_PORT=1 SLURM_STEP_LAUNCHER_PORT=1 SLURM_TOPOLOGY_ADDR="$(hostname)" \
    SLURM_CLUSTER_NAME=test SLURMD_NODENAME="$(hostname)" SLURM_MPI_TYPE=none "$@"
}
for cmd in "train --layers 1 --hidden 16 --heads 2 --seq 8 --steps 1 --dp 2 --tp 2" "check --tp 2 --dp 2"; do
  for rank in 0 3; do
    # shellcheck disable=SC2086
    out=$(srun_task $rank 4 timeout 60 "$ndmesh" $cmd 2>&1)
    rc=$?
    [ "$rc" -eq 2 ] || fail "ndmesh $cmd as task $rank of 4: exit $rc, expected 2: $out"
    [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] || fail "ndmesh $cmd: more than one line: $out"
    for needle in "SLURM_PROCID=$rank SLURM_NTASKS=4" "without PMIx" "srun --mpi=pmix -n 4" "MpiDefault=pmix"; do
      [[ "$out" == *"$needle"* ]] || fail "no '$needle' in: $out"
    done
  done
done
echo "ok: $out"
# One task of srun is refused too (Open MPI refuses it as well); with PMIx's variables the
# check lets MPI_Init run (which then finds no PMIx server: not this check's line).
out=$(srun_task 0 1 "$ndmesh" check --tp 1 2>&1)
[ $? -eq 2 ] && [[ "$out" == *"srun --mpi=pmix -n 1"* ]] || fail "srun -n 1 without PMIx: $out"
out=$(PMIX_RANK=0 srun_task 0 1 timeout 60 "$ndmesh" check --tp 1 2>&1)
[[ "$out" != *"without PMIx"* ]] || fail "refused with PMIX_RANK set: $out"
echo PASS
