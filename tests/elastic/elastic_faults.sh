#!/usr/bin/env bash
# Elastic data parallelism with real processes: a coordinator and 3 replicas of 2 ranks
# (tp 2) under mpirun, one fault per run, then every committed step checked against the
# uninterrupted serial run of the same flags.
# Usage: elastic_faults.sh <mode> <mpirun command...> <path to ndmesh>
#   (ELASTIC_TEST_LAYOUT: a replica's layout flags for its 2 ranks, default --tp 2)
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
flags=(--steps "$steps" --batch 6 --micro-batch 1 --layers 2 --hidden 64 --heads 4 --kv-heads 2 --seq 32
       --warmup 4 --eval-batches 1 --threads 1 --json)
export NDMESH_ELASTIC_TIMEOUT_S=5 NDMESH_LOG=info

start_coordinator() {  # start_coordinator <out>: sets coord_pid and addr
  "$ndmesh" coordinator --port "${1#*:}" --min-replicas 2 --heartbeat-timeout-s 2 --state-file "$tmp/state.json" \
    > "$tmp/${1%%:*}.out" 2> "$tmp/${1%%:*}.err" &
  coord_pid=$!
  pids+=("$coord_pid")
  for _ in $(seq 100); do
    grep -q "^coordinator listening on " "$tmp/${1%%:*}.out" && break
    sleep 0.1
  done
  addr=$(sed -n 's/^coordinator listening on //p' "$tmp/${1%%:*}.out")
  [ -n "$addr" ] || fail "the coordinator did not print its address"
}

start_replica() {  # start_replica <id> <name> [env...]: sets rpid
  local r=$1 name=$2
  shift 2
  env NDMESH_COORDINATOR="$addr" NDMESH_REPLICA_ID="$r" "$@" \
    timeout -k 5 200 "${mpirun[@]}" -np 2 "$ndmesh" train ${ELASTIC_TEST_LAYOUT:---tp 2} "${flags[@]}" > "$tmp/$name.out" 2> "$tmp/$name.err" &
  rpid=$!
  pids+=("$rpid")
}

committed() {  # the highest step printed by replica output $1
  { grep -o '"elastic_step":[0-9]*' "$tmp/$1.out" 2> /dev/null || true; } | tail -n 1 | cut -d: -f2
}

wait_step() {  # wait_step <output> <step>
  for _ in $(seq 2400); do  # up to 2 minutes (sanitizer builds, a loaded machine)
    local s
    s=$(committed "$1")
    [ -n "$s" ] && [ "$s" -ge "$2" ] && return 0
    sleep 0.05
  done
  fail "$1 never reached step $2"
}

start_coordinator coord:0
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
    start_coordinator coord2:"$port"
    ;;
  *) fail "unknown mode" ;;
esac
for p in "$r0" "$r2" "$rpid"; do wait "$p" || fail "a replica exited $?"; done
timeout 120 "$ndmesh" train "${flags[@]}" > "$tmp/serial.out" 2> "$tmp/serial.err" || fail "the serial run failed"

python3 - "$tmp" "$steps" "$mode" << 'PY' || fail "the checks above"
import json, pathlib, sys
tmp, steps, mode = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
serial = json.loads(tmp.joinpath("serial.out").read_text().strip().splitlines()[-1])
by_step = {}
for f in sorted(tmp.glob("r*.out")):
    mine = [json.loads(l) for l in f.read_text().splitlines() if l.startswith('{"elastic_step"')]
    got = [x["elastic_step"] for x in mine]
    # no repeat within one replica process (a healed one jumps ahead; the union has no gap)
    if any(b <= a for a, b in zip(got, got[1:])):
        sys.exit(f"{f.name}: steps {got} repeat or go back")
    if mode == "stop" and f.name == "r2.out" and got == list(range(got[0], got[0] + len(got))):
        sys.exit(f"r2.out: steps {got}: the stopped replica never fell behind and healed")
    for x in mine:
        by_step.setdefault(x["elastic_step"], []).append((f.name, x))
missing = [s for s in range(1, steps + 1) if s not in by_step]
if missing:
    sys.exit(f"steps never committed: {missing}")
sizes = []
for s in range(1, steps + 1):
    rows = by_step[s]
    hashes = {x["param_hash"] for _, x in rows}
    if len(hashes) != 1:
        sys.exit(f"step {s}: parameter hashes differ across replicas: {rows}")
    if len({(x['loss'], x['grad_norm']) for _, x in rows}) != 1:
        sys.exit(f"step {s}: losses or norms differ across replicas: {rows}")
    x = rows[0][1]
    sizes.append(x["replicas"])
    loss, g = serial["losses"][s - 1], serial["grad_norms"][s - 1]
    if abs(x["loss"] - loss) > 1e-5 * abs(loss):
        sys.exit(f"step {s}: loss {x['loss']} but the serial run's is {loss}")
    bound = 1e-5 if s == 1 else 1e-4
    if abs(x["grad_norm"] - g) > bound * abs(g):
        sys.exit(f"step {s}: gradient norm {x['grad_norm']} but the serial run's is {g}")
if mode != "coordinator":
    # the fault left 2 replicas training; the restarted (or resumed) one rejoined later
    if 2 not in sizes or 3 not in sizes[sizes.index(2):]:
        sys.exit(f"replicas per step {sizes}: expected steps on 2 replicas after the fault, then 3 again")
print(f"{mode}: {steps} steps equal the serial run; replicas per step {sizes}")
PY
echo "PASS ($mode)"
