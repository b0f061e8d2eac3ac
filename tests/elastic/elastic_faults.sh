#!/usr/bin/env bash
# Elastic data parallelism with real processes: a coordinator and 3 replicas of 2 ranks
# (tp 2) under mpirun, one fault per run, then every committed step checked against the
# uninterrupted serial run of the same flags.
# Usage: elastic_faults.sh <mode> <mpirun command...> <path to ndmesh>
#   (ELASTIC_TEST_LAYOUT: a replica's layout flags for its 2 ranks, default --tp 2;
#   ELASTIC_TEST_MODEL: model flags added to every run, the serial one too, e.g. --arch llama;
#   ELASTIC_TEST_LAYERS: the blocks, default 2)
#   mode reduce|vote|update: replica 1's rank 1 SIGKILLs itself at step 4 at that point
#        (NDMESH_TEST_ELASTIC_KILL); this script restarts replica 1, which rejoins and heals;
#   mode stop: replica 2 is stopped (SIGSTOP) past the heartbeat timeout, then resumed; it
#        must not commit the step it was in, and heals;
#   mode coordinator: the coordinator is killed and restarted from its --state-file.
# Checks: steps 1..N each committed (no gap) and printed at most once per replica process
# (no repeat); for each step every replica's loss, gradient norm and parameter hash agree;
# losses and gradient norms equal the serial run's (tests/support/compare_runs.sh bounds);
# the fault really changed the membership (steps with 2 replicas, then 3 again).
set -euo pipefail
mode=$1
shift
ndmesh=${*: -1}
mpirun=("${@:1:$#-1}")
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -CONT "$p" 2> /dev/null || true; kill -KILL "$p" 2> /dev/null || true; done
  wait 2> /dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL ($mode): $*" >&2
  for f in "$tmp"/*.err "$tmp"/coord*.out; do [ -s "$f" ] && { echo "--- $f" >&2; tail -n 30 "$f" >&2; }; done
  exit 1
}

steps=${ELASTIC_TEST_STEPS:-40}
flags=(--steps "$steps" --batch 6 --micro-batch 1 --layers "${ELASTIC_TEST_LAYERS:-2}" --hidden 64 --heads 4 --kv-heads 2 --seq 32
       --warmup 4 --eval-batches 1 --threads 1 --json)
# shellcheck disable=SC2206
flags+=(${ELASTIC_TEST_MODEL:-})
export NDMESH_ELASTIC_TIMEOUT_S=5 NDMESH_LOG=info

source "$(dirname "$0")/elastic_lib.sh"

start_coordinator coord:0 --state-file "$tmp/state.json"
kill_env=()
case $mode in
  reduce | vote | update) kill_env=(NDMESH_TEST_ELASTIC_KILL="1:1:4:$mode") ;;
esac
start_replica 0 r0
r0=$rpid
start_replica 1 r1 "${kill_env[@]}"
r1=$rpid
start_replica 2 r2
r2=$rpid
case $mode in
  reduce | vote | update)
    set +e
    wait "$r1"
    rc=$?
    set -e
    [ "$rc" -ne 0 ] || fail "replica 1 should have died at step 4, it exited 0"
    grep -q "kills itself at step 4 ($mode)" "$tmp/r1.err" || fail "replica 1 did not kill itself at step 4 ($mode)"
    wait_step r0 $((4 + 3))  # the others go on without it
    start_replica 1 r1b
    ;;
  stop)
    wait_step r2 3
    # the whole replica: mpirun and its ranks
    stopped=$(pgrep -P "$(pgrep -P "$r2")" || true)
    all=$(echo "$stopped" $(for p in $stopped; do pgrep -P "$p"; done))
    kill -STOP $all
    s=$(committed r0)
    wait_step r0 $((s + 4))  # the others go on past the heartbeat timeout
    kill -CONT $all
    ;;
  coordinator)
    wait_step r0 6
    port=${addr##*:}
    kill -KILL "$coord_pid"
    sleep 1
    start_coordinator coord2:"$port" --state-file "$tmp/state.json"
    ;;
  *) fail "unknown mode" ;;
esac
for p in "$r0" "$r2" "$rpid"; do wait "$p" || fail "a replica exited $?"; done
elastic_against_serial "elastic ($mode)" "$steps" "$tmp"/r*.out
sizes=$(python3 -c 'import json, sys; print(" ".join(map(str, json.load(open(sys.argv[1]))["replicas"])))' "$tmp/elastic.json")
echo "replicas per step: $sizes"
if [ "$mode" != coordinator ]; then
  # the fault left 2 replicas training; the restarted (or resumed) one rejoined later
  [[ " $sizes " =~ " 2 ".*" 3 " ]] || fail "replicas per step $sizes: expected steps on 2 replicas after the fault, then 3 again"
fi
if [ "$mode" = stop ]; then
  # the stopped replica fell behind and healed: its committed steps jump
  python3 -c 'import json, sys
got = [json.loads(l)["elastic_step"] for l in open(sys.argv[1]) if l.startswith("{\"elastic_step\"")]
sys.exit(got == list(range(got[0], got[0] + len(got))))' "$tmp/r2.out" ||
    fail "r2: the stopped replica never fell behind and healed"
fi
echo "PASS ($mode)"
