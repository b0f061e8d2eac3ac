#!/usr/bin/env bash
# --save in an elastic run: checkpoints hold committed state only. A coordinator and 3
# replicas of 2 ranks (tp 2) train with --save DIR --save-every 5; replica 0 (the first
# member, the one that writes) loses its rank 1 at step 10, a save step, after the commit
# and before the update (NDMESH_TEST_ELASTIC_KILL=0:1:10:update); this script restarts it.
# Once a replica has committed step 17 the whole job is lost (the coordinator killed: the
# replicas stop after NDMESH_ELASTIC_RECONNECT_S, writing no final checkpoint). The
# checkpoint left must be a save step >= 15, pass `ndmesh checkpoint inspect --verify`, and
# a non-elastic `ndmesh train --load` from it must reproduce the uninterrupted serial run's
# later steps (tests/support/compare_runs.sh bounds).
# Usage: elastic_save.sh <mpirun command...> <path to ndmesh>
set -euo pipefail
ndmesh=${*: -1}
mpirun=("${@:1:$#-1}")
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2> /dev/null || true; done
  wait 2> /dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL (save): $*" >&2
  for f in "$tmp"/*.err "$tmp"/coord.out; do [ -s "$f" ] && { echo "--- $f" >&2; tail -n 30 "$f" >&2; }; done
  exit 1
}

steps=40
every=5
flags=(--steps "$steps" --batch 6 --micro-batch 1 --layers 2 --hidden 64 --heads 4 --kv-heads 2 --seq 32
       --warmup 4 --eval-batches 1 --threads 1 --json)
export NDMESH_ELASTIC_TIMEOUT_S=5 NDMESH_ELASTIC_RECONNECT_S=2 NDMESH_LOG=info

source "$(dirname "$0")/elastic_lib.sh"
save=(-- --save "$tmp/ckpt" --save-every "$every")

start_coordinator coord:0
coord=$coord_pid
start_replica 0 r0 NDMESH_TEST_ELASTIC_KILL=0:1:10:update "${save[@]}"
r0=$rpid
start_replica 1 r1 "${save[@]}"
r1=$rpid
start_replica 2 r2 "${save[@]}"
r2=$rpid
set +e
wait "$r0"
rc=$?
set -e
[ "$rc" -ne 0 ] || fail "replica 0 should have died at step 10, it exited 0"
grep -q "kills itself at step 10 (update)" "$tmp/r0.err" || fail "replica 0 did not kill itself at step 10 (update)"
start_replica 0 r0b "${save[@]}"
r0b=$rpid
wait_step r1 17
# The whole job is lost: no coordinator, the replicas stop without a final checkpoint.
kill -KILL "$coord"
for p in "$r0b" "$r1" "$r2"; do
  set +e
  wait "$p"
  rc=$?
  set -e
  [ "$rc" -ne 0 ] || fail "a replica exited 0 without its coordinator (it should stop naming it)"
done
grep -q "$addr" "$tmp/r1.err" || fail "replica 1 did not name the coordinator it lost"

# The checkpoint left: a save step at or after 15 (step 17 was committed after every save
# before it), verified, holding a committed step's state.
"$ndmesh" checkpoint inspect "$tmp/ckpt" --verify > "$tmp/inspect.txt" 2>&1 || fail "checkpoint inspect --verify: $(cat "$tmp/inspect.txt")"
saved=$(sed -n 's/^step \([0-9]*\) .*/\1/p' "$tmp/inspect.txt")
[ -n "$saved" ] || fail "no step in 'checkpoint inspect': $(cat "$tmp/inspect.txt")"
echo "the checkpoint holds step $saved"
[ "$saved" -ge 15 ] && [ $((saved % every)) -eq 0 ] || fail "the checkpoint holds step $saved, not a save step >= 15"
timeout 120 "$ndmesh" train "${flags[@]}" > "$tmp/serial.out" 2> "$tmp/serial.err" || fail "the serial run failed"
timeout 120 "${mpirun[@]}" -np 2 "$ndmesh" train --tp 2 "${flags[@]}" --load "$tmp/ckpt" > "$tmp/resumed.out" 2> "$tmp/resumed.err" ||
  fail "the run resumed from the checkpoint failed: $(tail -n 5 "$tmp/resumed.err")"
tail -n 1 "$tmp/serial.out" > "$tmp/serial.json"
tail -n 1 "$tmp/resumed.out" > "$tmp/resumed.json"
expect_same "resumed at step $saved from the elastic run's checkpoint" "$tmp/serial.json" "$tmp/resumed.json" --from "$saved"
echo "PASS (save)"
