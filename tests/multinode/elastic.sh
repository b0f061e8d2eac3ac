#!/usr/bin/env bash
# Elastic data parallelism across nodes: a whole node loses its link, then its processes.
# Four nodes (tests/multinode/harness.sh): the coordinator on node0 (`ndmesh coordinator
# --host` node0's address), and replica r (0..2) a 2-rank mpirun (tp 2) on node r+1 of its
# own. After a few committed steps node3's link goes down and, a moment later, every
# process on it is SIGKILLed (no TCP reset reaches the others). Checks:
#  - the two other replicas commit their next step on their own (a generation of 2) within
#    the heartbeat timeout + one step (+ a slack for the loaded machine) of the link-down;
#    the measured time is printed;
#  - every step 1..N was committed, never twice by one replica, with the same loss, norm
#    and parameter hash on every replica that committed it, and the committed steps equal
#    the uninterrupted serial run's (tests/support/compare_runs.sh bounds).
#   elastic.sh <path to ndmesh>
#   (ELASTIC_NODE_LAYOUT: a replica's layout flags for its 2 ranks, default --tp 2;
#   ELASTIC_NODE_LAYERS: the blocks, default 2)
source "$(dirname "$0")/mn_lib.sh" "$@"
source "$here/../support/compare_runs.sh"

steps=${ELASTIC_NODE_STEPS:-120}
heartbeat_s=2
slack_s=${ELASTIC_NODE_SLACK_S:-1.5}  # polling, a loaded machine (the old wait: the 5 s reduction timeout)
flags=(--steps "$steps" --batch 6 --micro-batch 1 --layers "${ELASTIC_NODE_LAYERS:-2}" --hidden 64 --heads 4 --kv-heads 2 --seq 32
       --warmup 4 --eval-batches 1 --threads 1 --json)
export NDMESH_ELASTIC_TIMEOUT_S=5 NDMESH_LOG=info

mn_cluster c --nodes 4 --ranks 2
coord_host=$(mn_addr "$c" 0)
mn_enter "$c" 0 "$ndmesh" coordinator --host "$coord_host" --port 0 --min-replicas 2 \
  --heartbeat-timeout-s "$heartbeat_s" > "$tmp/coord.out" 2> "$tmp/coord.err" &
coord=$!
wait_for 30 "$coord" grep -qs "^coordinator listening on " "$tmp/coord.out" ||
  fail "the coordinator on node0 did not start: $(cat "$tmp/coord.err")"
addr=$(sed -n 's/^coordinator listening on //p' "$tmp/coord.out")
[ "${addr%:*}" = "$coord_host" ] || fail "the coordinator listens on $addr, not on node0's address $coord_host"

reps=()
for r in 0 1 2; do
  mn_enter "$c" $((r + 1)) env NDMESH_COORDINATOR="$addr" NDMESH_REPLICA_ID="$r" \
    timeout -k 5 120 mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader -np 2 \
    "$ndmesh" train ${ELASTIC_NODE_LAYOUT:---tp 2} "${flags[@]}" > "$tmp/r$r.out" 2> "$tmp/r$r.err" &
  reps+=($!)
done

committed() {  # committed <replica> [replicas]: its highest committed step (in a generation of that size)
  { grep "\"replicas\":${2:-[0-9]*}," "$tmp/r$1.out" 2> /dev/null || true; } |
    grep -o '"elastic_step":[0-9]*' | tail -n 1 | cut -d: -f2
}
reached() {  # reached <replica> <step> [replicas]: committed that step or a later one (in such a generation)
  local s
  s=$(committed "$1" "${3:-}")
  [ -n "$s" ] && [ "$s" -ge "$2" ]
}
report() {
  local f
  for f in "$tmp"/*.err; do [ -s "$f" ] && { echo "--- $f"; tail -n 20 "$f"; }; done
}

# A few steps of all three, timed (one step: the mean of 5).
wait_for 90 "${reps[0]}" reached 0 1 3 || { report; fail "the three replicas never committed a step together"; }
first=$(committed 0 3)
t0=$(date +%s.%N)
wait_for 60 "${reps[0]}" reached 0 $((first + 5)) 3 || { report; fail "replica 0 never committed step $((first + 5))"; }
step_s=$(awk -v t="$(elapsed_since "$t0")" 'BEGIN{printf "%.3f", t / 5}')
before=$(committed 0)
start=$(date +%s.%N)
mn_link "$c" down 3
sleep 0.5
mn_kill_node "$c" 3
# The survivors' first step of their own: a generation of 2 replicas.
wait_for 60 "${reps[0]}" reached 0 $((before + 1)) 2 || { report; fail "replicas 0 and 1 never committed a step without node3"; }
elapsed=$(elapsed_since "$start")
after=$(grep '"replicas":2,' "$tmp/r0.out" | grep -o '"elastic_step":[0-9]*' | cut -d: -f2 | awk -v b="$before" '$1 > b' | head -n 1)
limit=$(awk -v h="$heartbeat_s" -v s="$step_s" -v k="$slack_s" 'BEGIN{printf "%.2f", h + s + k}')
echo "node3 link down after step $before; replicas 0 and 1 committed step $after on their own ${elapsed} s later" \
  "(heartbeat timeout $heartbeat_s s, a step ${step_s} s before the fault, limit $limit s with $slack_s s slack)"
grep -hE 'failed in generation|connections shut' "$tmp/r0.err" "$tmp/r1.err" | cut -c1-240
awk -v e="$elapsed" -v l="$limit" 'BEGIN{exit !(e < l)}' || fail "the survivors took ${elapsed} s (limit $limit s)"

for r in 0 1; do wait "${reps[$r]}" || { report; fail "replica $r exited $?"; }; done
wait "${reps[2]}" 2> /dev/null && fail "replica 2 (node3, killed) exited 0"
kill "$coord" 2> /dev/null
wait "$coord" 2> /dev/null
timeout 120 "$ndmesh" train "${flags[@]}" > "$tmp/serial.out" 2> "$tmp/serial.err" || fail "the serial run failed"
tail -n 1 "$tmp/serial.out" > "$tmp/serial.json"

# The committed steps of every replica (no gap, no repeat, one loss, norm and hash per step),
# their union as one run for compare_runs.sh.
python3 "$here/../elastic/committed_steps.py" "$steps" "$tmp"/r*.out > "$tmp/elastic.json" ||
  fail "the committed steps (above)"
python3 - "$tmp/elastic.json" << 'PY' || fail "the generations' sizes (above)"
import json, sys
sizes = json.load(open(sys.argv[1]))["replicas"]
if 3 not in sizes or sizes[-1] != 2 or 3 in sizes[sizes.index(2, sizes.index(3)):]:
    sys.exit(f"replicas per step {sizes}: expected 3 replicas, then 2 after the fault to the end")
print(f"replicas per step {sizes}")
PY
expect_same "elastic, node3 lost" "$tmp/serial.json" "$tmp/elastic.json"
echo "PASS"
