#!/usr/bin/env bash
# build/bin/parallel_config on 4 ranks prints seed 000's example output: the four
# ParallelConfig lines below are copied from the example of the first seed system (tp=2, pp=1, dp=2).
#   parallel_config_seed000.sh <mpirun command...> <path of parallel_config>
set -uo pipefail
out=$("$@" --tp 2 --pp 1 --dp 2 2>&1)
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: exit $rc"; exit 1; }
expected='Process 0: ParallelConfig(global_rank=0, world_size=4, tp=2[rank=0], pp=1[rank=0], dp=2[rank=0])
Process 1: ParallelConfig(global_rank=1, world_size=4, tp=2[rank=1], pp=1[rank=0], dp=2[rank=0])
Process 2: ParallelConfig(global_rank=2, world_size=4, tp=2[rank=0], pp=1[rank=0], dp=2[rank=1])
Process 3: ParallelConfig(global_rank=3, world_size=4, tp=2[rank=1], pp=1[rank=0], dp=2[rank=1])'
got=$(echo "$out" | grep '^Process [0-9]*: ' | sort)
[ "$got" = "$expected" ] || { echo "FAIL: ParallelConfig lines differ from seed 000"; diff <(echo "$expected") <(echo "$got"); exit 1; }
for r in 0 1 2 3; do
  echo "$out" | grep -Eq "^Process $r using (GPU [0-9]+|CPU)" || { echo "FAIL: no device line for process $r"; exit 1; }
done
# A layout that does not fit the world: exit 2 naming the sizes, on every rank.
out=$("$@" --tp 2 --pp 2 --dp 2 2>&1)
[ $? -ne 0 ] || { echo "FAIL: 8-rank layout on 4 ranks passed"; exit 1; }
[[ "$out" == *"= 8 but the world has 4 ranks"* ]] || { echo "FAIL: unclear error: $out"; exit 1; }
echo PASS
