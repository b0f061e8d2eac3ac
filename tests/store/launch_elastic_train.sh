#!/usr/bin/env bash
# `ndmesh launch --elastic` end to end: the launcher starts the coordinator and 3 replicas of
# `ndmesh train --tp 2`; one rank of replica 1 SIGKILLs itself inside the reduction across
# replicas of step 3 (NDMESH_TEST_ELASTIC_KILL). The launcher ends replica 1 whole and
# starts it again, it rejoins, and the job exits 0; replicas 0 and 2 committed every step
# once, with the serial run's losses and gradient norms (compare_runs.sh); every replica
# that computed a step reports the same parameter hash for it; afterwards no process of the
# job is left and the coordinator's port is free.
#   launch_elastic_train.sh <ndmesh>
set -uo pipefail
ndmesh=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
marker=4343
trap 'pkill -9 -f -- "--seed $marker" 2>/dev/null; rm -rf "$tmp"' EXIT
source "$(dirname "$0")/../support/compare_runs.sh"
steps=8
model=(--layers 2 --hidden 32 --heads 4 --kv-heads 2 --seq 16 --markov-vocab 16 --threads 1 --eval-batches 0
  --batch 8 --steps $steps --seed $marker --json)
"$ndmesh" train "${model[@]}" 2> "$tmp/serial.err" | tail -n 1 > "$tmp/serial.json" ||
  fail "serial run: $(tail -n 3 "$tmp/serial.err")"

NDMESH_TEST_ELASTIC_KILL=1:1:3:reduce timeout 120 "$ndmesh" launch --elastic --replicas 3 --max-restarts 2 -n 2 \
  -- "$ndmesh" train "${model[@]}" --tp 2 > "$tmp/out" 2> "$tmp/err"
rc=$?
[ $rc -eq 0 ] || fail "the elastic job exited $rc: $(tail -n 20 "$tmp/err"; tail -n 20 "$tmp/out")"
grep -q 'replica 1 rank 1 exited with status 137 (SIGKILL); ending its ranks to start it again (restart 1 of 2)' \
  "$tmp/err" || fail "no line on the killed rank: $(cat "$tmp/err")"
grep -q 'replica 1 starts again (restart 1 of 2)' "$tmp/err" || fail "replica 1 was not restarted"
grep -q '^\[coordinator\] coordinator listening on 127.0.0.1:[0-9]*$' "$tmp/out" ||
  fail "no coordinator address line: $(head -n 5 "$tmp/out")"

# Each replica's final JSON (its lead's last JSON line with "losses").
for r in 0 1 2; do
  sed -n "s/^\[r$r\.0\] \({.*\"losses\".*\)$/\1/p" "$tmp/out" | tail -n 1 > "$tmp/r$r.json"
done
for r in 0 2; do
  got=$(jq -c '.elastic_steps' "$tmp/r$r.json")
  [ "$got" = "$(seq -s, 1 $steps | sed 's/^/[/; s/$/]/')" ] || fail "replica $r committed the steps $got"
  expect_same "replica $r of 3 (tp 2), replica 1 killed at step 3" "$tmp/serial.json" "$tmp/r$r.json"
done
# The restarted replica rejoined: it computed some of the later steps.
[ "$(jq '.elastic_steps | length' "$tmp/r1.json" 2> /dev/null || echo 0)" -ge 1 ] ||
  fail "the restarted replica 1 committed no step: $(grep '^\[r1\.0\]' "$tmp/out" | tail -n 5)"
# One parameter hash per step across the replicas that computed it.
sed -n 's/^\[r[0-9]*\.0\] \({"elastic_step".*\)$/\1/p' "$tmp/out" | jq -r '"\(.elastic_step) \(.param_hash)"' |
  sort -u > "$tmp/hashes"
[ "$(cut -d' ' -f1 "$tmp/hashes" | uniq -d)" = "" ] ||
  fail "replicas disagree on the parameters after a step: $(cat "$tmp/hashes")"
[ "$(wc -l < "$tmp/hashes")" -eq $steps ] || fail "hashes for $(wc -l < "$tmp/hashes") steps, expected $steps"

sleep 0.2
pgrep -f -- "--seed $marker" > /dev/null && fail "processes of the job remain: $(pgrep -af -- "--seed $marker")"
port=$(sed -n 's/^\[coordinator\] coordinator listening on 127.0.0.1:\([0-9]*\)$/\1/p' "$tmp/out")
python3 -c "import socket; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1);
s.bind(('127.0.0.1', $port)); s.listen()" || fail "the coordinator's port $port is not free"
echo PASS
