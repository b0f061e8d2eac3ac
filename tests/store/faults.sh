#!/usr/bin/env bash
# Launches without mpirun that go wrong end fast with one line naming the cause:
# a rank that never arrives (exit 124 naming it, within twice NDMESH_INIT_TIMEOUT_S), a
# wrong WORLD_SIZE on one rank, MASTER_PORT missing or in use, RANK given twice,
# NDMESH_BACKEND=nccl without a GPU or mpi (exit 2), and a rank killed mid-training: the launcher leaves
# the others running (--keep-going), and they must end non-zero by themselves within
# twice NDMESH_TIMEOUT_S.
#   faults.sh <ndmesh> <launcher command...>
# The launcher command is `python3 tests/store/torchrun_env.py [--agent-store]`; the port in
# use and the killed rank are tested with rank 0's store, RANK given twice with the agent's.
set -uo pipefail
ndmesh=$1
shift
run=("$@")
tmp=$(mktemp -d)
trap 'pkill -9 -f -- "--seed 6661" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.2f", b - a}'; }

# expect <rc> <needle> <max seconds> <launcher args...> -- <program args...>
expect() {
  local rc=$1 needle=$2 limit=$3 start out got elapsed
  shift 3
  start=$(now)
  out=$(timeout 120 "$@" 2>&1)
  got=$?
  end=$(now)
  # Timed from the ranks' start (the launcher's line), not from the launcher's own start-up.
  started=$(sed -n 's/^torchrun_env: ranks started at //p' <<< "$out" | head -n 1)
  elapsed=$(awk -v a="${started:-$start}" -v b="$end" 'BEGIN{printf "%.2f", b - a}')
  [ "$got" -eq "$rc" ] || fail "exit $got, expected $rc: $*: $out"
  grep -qF -- "$needle" <<< "$out" || fail "no '$needle' in: $out"
  awk -v e="$elapsed" -v l="$limit" 'BEGIN{exit !(e < l)}' || fail "took ${elapsed} s (limit $limit s): $*"
  echo "ok (exit $got, ${elapsed} s): $(grep -F -- "$needle" <<< "$out" | head -n 1)"
}

agent=0
[[ " ${run[*]} " == *" --agent-store "* ]] && agent=1
{
  NDMESH_INIT_TIMEOUT_S=3 expect 124 "rank 3 of WORLD_SIZE=4 did not arrive at the store" 6 \
    "${run[@]}" --omit-rank 3 -np 4 "$ndmesh" check --tp 2 --dp 2
  expect 2 "WORLD_SIZE=5 on rank 2 but rank 0 has WORLD_SIZE=4" 6 \
    "${run[@]}" --set 2:WORLD_SIZE=5 -np 4 "$ndmesh" check --tp 2 --dp 2
  expect 2 "MASTER_PORT is not" 6 "${run[@]}" --set 1:MASTER_PORT= -np 2 "$ndmesh" check --tp 2
  # nccl carries device buffers over the Gloo bootstrap: without a GPU each rank says so.
  NDMESH_BACKEND=nccl expect 2 "use --device cpu" 6 \
    "${run[@]}" -np 2 "$ndmesh" train --device cuda --dp 2 --steps 1 --layers 1 --hidden 16 --heads 2 --seq 8 --batch 2
  NDMESH_BACKEND=mpi expect 2 "NDMESH_BACKEND=mpi" 6 "${run[@]}" -np 2 "$ndmesh" check --tp 2
}

if [ "$agent" -eq 1 ]; then
  # RANK given to two processes (the agent serves the store, so both reach it).
  NDMESH_INIT_TIMEOUT_S=10 expect 2 "RANK=0 is used by two processes" 6 \
    "${run[@]}" --set 1:RANK=0 -np 2 "$ndmesh" check --tp 2
  echo PASS
  exit 0
fi

# A port in use: rank 0 cannot serve the store there.
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
python3 -c "import socket,time; s=socket.socket(); s.bind(('0.0.0.0',$port)); s.listen(); time.sleep(60)" &
holder=$!
sleep 0.3
expect 2 "MASTER_PORT=$port is in use" 6 "${run[@]}" --master-port "$port" -np 2 "$ndmesh" check --tp 2
kill "$holder"

# A rank killed in the middle of dp x tp training; nobody kills the others for it.
timeout_s=5
model=(--layers 2 --hidden 32 --heads 4 --kv-heads 2 --seq 16 --markov-vocab 16 --threads 1 --eval-batches 0
  --batch 8 --seed 6661 --steps 1000000)
NDMESH_TIMEOUT_S=$timeout_s "${run[@]}" --keep-going -np 4 "$ndmesh" train "${model[@]}" --dp 2 --tp 2 \
  > "$tmp/out.txt" 2>&1 &
job=$!
for _ in $(seq 1 600); do
  grep -q '^step 6/' "$tmp/out.txt" 2>/dev/null && break
  kill -0 "$job" 2>/dev/null || fail "training ended before the kill: $(cat "$tmp/out.txt")"
  sleep 0.1
done
victim=$(pgrep -P "$job" | sed -n 2p)  # rank 1: the launcher's second child
[ -n "$victim" ] || fail "no rank process to kill"
kill -9 "$victim"
start=$(now)
wait "$job"
rc=$?
elapsed=$(since "$start")
echo "a rank killed mid-training: the others ended ${elapsed} s later (limit $((2 * timeout_s)) s), exit $rc"
grep -E "^ndmesh: " "$tmp/out.txt" | head -n 3
[ "$rc" -ne 0 ] || fail "the job exited 0 after a rank was killed"
awk -v e="$elapsed" -v t="$timeout_s" 'BEGIN{exit !(e < 2 * t)}' || fail "the job took ${elapsed} s to end"
pgrep -f -- "--seed 6661" > /dev/null && fail "ranks still running after the job ended"
echo PASS
