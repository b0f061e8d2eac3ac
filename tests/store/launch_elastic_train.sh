#!/usr/bin/env bash
# `ndmesh launch --elastic` end to end: the launcher starts the coordinator and 3 replicas of
# `ndmesh train --tp 2` (--min-replicas 3); one rank of replica 1 SIGKILLs itself inside the
# reduction across replicas of step 3 (NDMESH_TEST_ELASTIC_KILL, first start only). The
# launcher ends replica 1 whole and starts it again, it rejoins and heals, and the job exits
# 0; the committed steps are 1..8 with no gap and no repeat, the replicas agree on each
# step's loss, gradient norm and parameter hash, and the losses and gradient norms equal the
# serial run's (compare_runs.sh); afterwards no process of the job is left and the
# coordinator's port is free. The same job as on a cluster: a coordinator started by hand
# and the launcher commands --print-cluster-commands prints (one per replica, --replica-id),
# a replica killed and restarted by its own launcher. Then the coordinator is killed
# mid-training: the launcher ends every replica within seconds, with one line naming it.
#   launch_elastic_train.sh <ndmesh>
set -uo pipefail
ndmesh=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
marker=4343
coordinator=""
trap 'pkill -9 -f -- "--seed $marker" 2>/dev/null; [ -z "$coordinator" ] || kill -9 "$coordinator" 2>/dev/null
  [ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../support/compare_runs.sh"
steps=8
model=(--layers 2 --hidden 32 --heads 4 --kv-heads 2 --seq 16 --markov-vocab 16 --threads 1 --eval-batches 0
  --batch 8 --seed $marker --json)
"$ndmesh" train "${model[@]}" --steps $steps 2> "$tmp/serial.err" | tail -n 1 > "$tmp/serial.json" ||
  fail "serial run: $(tail -n 3 "$tmp/serial.err")"

# The switch holds for the first start only (TORCHELASTIC_RESTART_COUNT=0): the restarted
# replica may rejoin before the others committed step 3, and must not kill itself again.
# shellcheck disable=SC2016
once='[ "$TORCHELASTIC_RESTART_COUNT" = 0 ] || unset NDMESH_TEST_ELASTIC_KILL; exec "$@"'
# --min-replicas 3: no step commits without replica 1, so its restart must rejoin (and heal
# from the others' step 2) for the job to finish; with the default 2 a replica that starts
# late may find the run over.
NDMESH_TEST_ELASTIC_KILL=1:1:3:reduce timeout 120 "$ndmesh" launch --elastic --replicas 3 --min-replicas 3 \
  --max-restarts 2 -n 2 -- bash -c "$once" rank "$ndmesh" train "${model[@]}" --steps $steps --tp 2 > "$tmp/out" 2> "$tmp/err"
rc=$?
[ $rc -eq 0 ] || fail "the elastic job exited $rc: $(tail -n 20 "$tmp/err"; tail -n 20 "$tmp/out")"
grep -q 'replica 1 rank 1 exited with status 137 (SIGKILL); ending its ranks to start it again (restart 1 of 2)' \
  "$tmp/err" || fail "no line on the killed rank: $(cat "$tmp/err")"
grep -q 'replica 1 starts again (restart 1 of 2)' "$tmp/err" || fail "replica 1 was not restarted"
grep -q '^\[coordinator\] coordinator listening on 127.0.0.1:[0-9]*$' "$tmp/out" ||
  fail "no coordinator address line: $(head -n 5 "$tmp/out")"

# Every replica's lead prints one JSON line per step it committed. Which replicas compute a
# step depends on who is live (a replica that starts late joins at a later step and heals),
# so the checks are on the steps: each replica's steps rise without a repeat, together they
# are 1..steps, the replicas that committed a step agree on its loss, gradient norm and
# parameter hash, and those equal the serial run's.
sed -n 's/^\[r\([0-9]*\)\.0\] \({"elastic_step".*\)$/\1 \2/p' "$tmp/out" > "$tmp/lines"
for r in 0 1 2; do
  got=$(awk -v r=$r '$1 == r {print $2}' "$tmp/lines" | jq -s -c 'map(.elastic_step)')
  jq -e 'length > 0 and (. == (sort | unique))' <<< "$got" > /dev/null ||
    fail "replica $r committed the steps $got (a repeat, out of order, or none)"
done
cut -d' ' -f2- "$tmp/lines" | jq -s -c 'group_by(.elastic_step) | map(map([.loss, .grad_norm, .param_hash]) | unique)
  | map(select(length > 1))' > "$tmp/disagree"
[ "$(cat "$tmp/disagree")" = "[]" ] || fail "replicas disagree on a step: $(cat "$tmp/disagree")"
cut -d' ' -f2- "$tmp/lines" | jq -s -c 'group_by(.elastic_step) | map(.[0])
  | {steps: map(.elastic_step), losses: map(.loss), grad_norms: map(.grad_norm)}' > "$tmp/elastic.json"
[ "$(jq -c .steps "$tmp/elastic.json")" = "[$(seq -s, 1 $steps)]" ] ||
  fail "the committed steps are $(jq -c .steps "$tmp/elastic.json"), expected 1..$steps"
expect_same "3 replicas of tp 2, replica 1 killed at step 3 and restarted" "$tmp/serial.json" "$tmp/elastic.json"
# The restarted replica rejoined: it committed steps after its restart.
[ "$(awk '$1 == 1 {print $2}' "$tmp/lines" | jq -s 'map(.elastic_step) | max')" -eq $steps ] ||
  fail "the restarted replica 1 did not commit the last step: $(awk '$1 == 1' "$tmp/lines" | tail -n 3)"
sleep 0.2
pgrep -f -- "--seed $marker" > /dev/null && fail "processes of the job remain: $(pgrep -af -- "--seed $marker")"
port=$(sed -n 's/^\[coordinator\] coordinator listening on 127.0.0.1:\([0-9]*\)$/\1/p' "$tmp/out")
python3 -c "import socket; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1);
s.bind(('127.0.0.1', $port)); s.listen()" || fail "the coordinator's port $port is not free"
echo "ok: a replica killed at step 3 was restarted and rejoined; every committed step equals the serial run's"

# As on a cluster: a coordinator started by hand, and the launcher commands that
# --print-cluster-commands prints, one per replica (`--replica-id r`), run as printed (with
# this ndmesh first on PATH). Replica 2's rank 0 dies at step 4 once; its own launcher
# restarts it; every launcher exits 0 and the steps equal the serial run's.
"$ndmesh" coordinator --port 0 --min-replicas 3 > "$tmp/coord.out" 2>&1 &
coordinator=$!
for _ in $(seq 1 300); do grep -q 'listening' "$tmp/coord.out" && break; sleep 0.1; done
address=$(sed -n 's/^coordinator listening on \(.*\)$/\1/p' "$tmp/coord.out")
[ -n "$address" ] || fail "the coordinator printed no address: $(cat "$tmp/coord.out")"
"$ndmesh" launch --elastic --replicas 3 --max-restarts 1 -n 2 --coordinator "$address" --print-cluster-commands \
  -- bash -c "$once" rank ndmesh train "${model[@]}" --steps $steps --tp 2 > "$tmp/commands" ||
  fail "--print-cluster-commands: $(cat "$tmp/commands")"
[ "$(grep -c '^ndmesh launch --elastic' "$tmp/commands")" -eq 3 ] || fail "not 3 launchers: $(cat "$tmp/commands")"
pids=()
r=0
while IFS= read -r line; do
  PATH="$(dirname "$ndmesh"):$PATH" NDMESH_TEST_ELASTIC_KILL=2:0:4:reduce bash -c "$line" > "$tmp/node$r.out" \
    2> "$tmp/node$r.err" &
  pids+=($!)
  r=$((r + 1))
done < <(grep '^ndmesh launch --elastic' "$tmp/commands")
for r in 0 1 2; do
  wait "${pids[$r]}" || fail "the launcher of replica $r exited $?: $(tail -n 5 "$tmp/node$r.err")"
done
kill -TERM $coordinator
wait $coordinator || fail "the coordinator did not exit 0 on SIGTERM"
coordinator=""
grep -q 'replica 2 rank 0 exited with status 137 (SIGKILL); ending its ranks to start it again (restart 1 of 1)' \
  "$tmp/node2.err" || fail "replica 2 was not restarted by its launcher: $(cat "$tmp/node2.err")"
cat "$tmp"/node*.out | sed -n 's/^\[r[0-9]*\.0\] \({"elastic_step".*\)$/\1/p' |
  jq -s -c 'group_by(.elastic_step) | {disagree: map(map([.loss, .grad_norm, .param_hash]) | unique
  | select(length > 1)), steps: map(.[0].elastic_step), losses: map(.[0].loss), grad_norms: map(.[0].grad_norm)}' \
  > "$tmp/cluster.json"
[ "$(jq -c .disagree "$tmp/cluster.json")" = "[]" ] ||
  fail "one launcher per replica: replicas disagree: $(jq -c .disagree "$tmp/cluster.json")"
[ "$(jq -c .steps "$tmp/cluster.json")" = "[$(seq -s, 1 $steps)]" ] ||
  fail "one launcher per replica: the committed steps are $(jq -c .steps "$tmp/cluster.json")"
expect_same "one launcher per replica (--replica-id), replica 2 killed at step 4" "$tmp/serial.json" \
  "$tmp/cluster.json"
echo "ok: the printed cluster commands run the job: a killed replica restarted by its own launcher"

# The coordinator dies (SIGKILL) mid-training: the launcher ends every replica at once, with
# one line naming the coordinator, and leaves nothing.
: > "$tmp/out"
"$ndmesh" launch --elastic --replicas 2 -n 2 -- "$ndmesh" train "${model[@]}" --steps 1000000 --tp 2 \
  > "$tmp/out" 2> "$tmp/err" &
job=$!
for _ in $(seq 1 600); do
  grep -q '"elastic_step":3,' "$tmp/out" && break
  kill -0 $job 2> /dev/null || fail "the job ended early: $(tail -n 5 "$tmp/err")"
  sleep 0.1
done
child=$(pgrep -P $job -f ' coordinator --port 0 ')
[ -n "$child" ] || fail "no coordinator child of the launcher: $(ps -o pid,args --ppid $job)"
kill -9 "$child"
start=$(date +%s.%N)
wait $job
rc=$?
elapsed=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b - a}')
[ $rc -eq 137 ] || fail "the coordinator killed: exit $rc, expected 137: $(tail -n 5 "$tmp/err")"
awk -v e="$elapsed" 'BEGIN{exit !(e < 5)}' || fail "the coordinator killed: the launcher took $elapsed s"
tail -n 1 "$tmp/err" | grep -q '^ndmesh: \[launch\] the coordinator at 127.0.0.1:[0-9]* ended with status 137 (SIGKILL); without it no replica can commit a step' ||
  fail "the coordinator killed: last line: $(tail -n 1 "$tmp/err")"
sleep 0.2
pgrep -f -- "--seed $marker" > /dev/null && fail "processes of the job remain: $(pgrep -af -- "--seed $marker")"
echo "ok: the coordinator killed: the job ended in $elapsed s with one line, nothing left"
echo PASS
