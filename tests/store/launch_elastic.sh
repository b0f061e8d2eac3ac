#!/usr/bin/env bash
# `ndmesh launch --elastic`'s supervision, with a stand-in replica program (a shell script
# that records its environment and, on its first run, has one rank die) and a coordinator
# address that nothing serves (the stand-in never connects to it):
#  - a replica whose rank dies of SIGKILL is ended whole (its other rank, which would
#    sleep 30 s, included) and started again with the same NDMESH_REPLICA_ID, its own new
#    store port and TORCHELASTIC_RESTART_COUNT=1, while the other replicas run on,
#    started once; the job exits 0 when every replica's ranks exit 0; output lines are
#    tagged [rREPLICA.RANK];
#  - --max-restarts used up: the job ends with the rank's status and one line naming
#    the replica, the rank and the flag; the other replicas' ranks are ended, nothing left;
#  - a rank's exit 2 (bad input) is not restarted;
#  - --replica-id runs only that replica;
#  - SIGTERM to the launcher ends every replica (a rank's own child included) with 143;
#  - bad flag combinations get one-line errors naming the flag; --print-cluster-commands;
#  - with the coordinator started by the launcher (the real one): a failure when fewer than
#    --min-replicas replicas are left to take part ends the job, the coordinator included.
#   launch_elastic.sh <ndmesh>
set -uo pipefail
ndmesh=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
marker=7337
trap 'pkill -9 -f "sleep 3[0-9].$marker" 2>/dev/null; rm -rf "$tmp"' EXIT
export NDMESH_TIMEOUT_S=8  # the grace period SIGTERM -> SIGKILL is a quarter: 2 s
left() { pgrep -f "sleep 3[0-9].$marker"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.2f", b - a}'; }

# The stand-in replica program: replica-rank-restart records; replica $DIE_REPLICA's rank 1
# dies (SIGKILL, or exit $DIE_STATUS) on every run up to restart $DIE_UNTIL while its rank 0
# sleeps 30 s; every other rank sleeps $SLEEP s and exits 0.
cat > "$tmp/replica.sh" << 'EOF'
#!/usr/bin/env bash
dir=$1
id=$NDMESH_REPLICA_ID.$RANK.$TORCHELASTIC_RESTART_COUNT
env | grep -E '^(NDMESH_COORDINATOR|NDMESH_REPLICA_ID|RANK|WORLD_SIZE|MASTER_PORT|TORCHELASTIC_RESTART_COUNT)=' \
  | sort > "$dir/start.$id"
echo "replica $NDMESH_REPLICA_ID rank $RANK up"
if [ "$NDMESH_REPLICA_ID" = "${DIE_REPLICA:--}" ] && [ "$TORCHELASTIC_RESTART_COUNT" -le "${DIE_UNTIL:-0}" ]; then
  if [ "$RANK" = 1 ]; then
    sleep "${DIE_AFTER:-0.5}"
    [ -n "${DIE_STATUS:-}" ] && exit "$DIE_STATUS"
    kill -9 $$
  fi
  exec sleep "30.$MARKER"
fi
sleep "${SLEEP:-3}"
echo "replica $NDMESH_REPLICA_ID rank $RANK done"
EOF
chmod +x "$tmp/replica.sh"
export MARKER=$marker
coord=127.0.0.1:9  # nothing serves it; the stand-in never connects

# 1. A rank of replica 1 dies once: replica 1 restarts, the others run on.
mkdir "$tmp/a"
start=$(now)
DIE_REPLICA=1 DIE_UNTIL=0 "$ndmesh" launch --elastic --replicas 3 --max-restarts 1 -n 2 --coordinator $coord \
  -- "$tmp/replica.sh" "$tmp/a" > "$tmp/a.out" 2>&1
rc=$?
elapsed=$(since "$start")
[ $rc -eq 0 ] || fail "restart: exit $rc: $(cat "$tmp/a.out")"
awk -v e="$elapsed" 'BEGIN{exit !(e < 20)}' || fail "restart: took $elapsed s: the dying replica's rank 0 was not ended"
want="0.0.0 0.1.0 1.0.0 1.0.1 1.1.0 1.1.1 2.0.0 2.1.0"
got=$(cd "$tmp/a" && ls start.* | sed 's/^start\.//' | sort | paste -sd' ')
[ "$got" = "$want" ] || fail "restart: the runs were [$got], expected [$want]: $(cat "$tmp/a.out")"
for f in "$tmp"/a/start.*; do
  id=${f##*/start.}
  grep -qx "NDMESH_COORDINATOR=$coord" "$f" || fail "restart: $id has no NDMESH_COORDINATOR=$coord"
  grep -qx "NDMESH_REPLICA_ID=${id%%.*}" "$f" || fail "restart: $id has the wrong NDMESH_REPLICA_ID: $(cat "$f")"
  grep -qx "TORCHELASTIC_RESTART_COUNT=${id##*.}" "$f" || fail "restart: $id: wrong restart count: $(cat "$f")"
  grep -qx "WORLD_SIZE=2" "$f" || fail "restart: $id: WORLD_SIZE is not -n 2: $(cat "$f")"
done
ports=$(cat "$tmp"/a/start.*.0.* | sed -n 's/^MASTER_PORT=//p' | sort -u | wc -l)
[ "$ports" -eq 4 ] || fail "restart: $ports distinct store ports for 4 replica starts"
[ "$(grep "^MASTER_PORT" "$tmp/a/start.1.0.1")" = "$(grep "^MASTER_PORT" "$tmp/a/start.1.1.1")" ] ||
  fail "restart: the restarted replica's ranks do not share their store"
grep -q '^\[r2\.1\] replica 2 rank 1 done$' "$tmp/a.out" || fail "restart: no tagged line: $(cat "$tmp/a.out")"
grep -q 'replica 1 rank 1 exited with status 137 (SIGKILL); ending its ranks to start it again (restart 1 of 1)' \
  "$tmp/a.out" || fail "restart: no line naming the failure: $(cat "$tmp/a.out")"
left > /dev/null && fail "restart: processes remain: $(ps -o pid,args -p "$(left | paste -sd,)")"
echo "ok: a replica whose rank died was restarted whole (${elapsed} s), the others ran on"

# 2. The restarts used up: the job ends with the rank's status and one line.
mkdir "$tmp/b"
start=$(now)
DIE_REPLICA=2 DIE_UNTIL=5 SLEEP=31.$marker "$ndmesh" launch --elastic --replicas 3 --max-restarts 1 -n 2 \
  --coordinator $coord -- "$tmp/replica.sh" "$tmp/b" > "$tmp/b.out" 2>&1
rc=$?
elapsed=$(since "$start")
[ $rc -eq 137 ] || fail "used up: exit $rc, expected 137: $(cat "$tmp/b.out")"
awk -v e="$elapsed" 'BEGIN{exit !(e < 20)}' || fail "used up: took $elapsed s"
last=$(tail -n 1 "$tmp/b.out")
[ "$last" = "ndmesh: [launch] replica 2 rank 1 exited with status 137 (SIGKILL) and was restarted 1 time already (--max-restarts 1): the job ends" ] ||
  fail "used up: last line: $last"
[ -e "$tmp/b/start.2.1.1" ] && [ ! -e "$tmp/b/start.2.1.2" ] || fail "used up: not exactly one restart: $(ls "$tmp/b")"
sleep 0.2
left > /dev/null && fail "used up: processes remain: $(ps -o pid,args -p "$(left | paste -sd,)")"
echo "ok: --max-restarts used up ends the job (exit 137, ${elapsed} s), nothing left"

# 3. Exit 2 (bad input) is not restarted.
mkdir "$tmp/c"
DIE_REPLICA=0 DIE_UNTIL=5 DIE_STATUS=2 SLEEP=1 "$ndmesh" launch --elastic --replicas 2 --max-restarts 3 -n 2 \
  --coordinator $coord -- "$tmp/replica.sh" "$tmp/c" > "$tmp/c.out" 2>&1
rc=$?
[ $rc -eq 2 ] || fail "exit 2: exit $rc: $(cat "$tmp/c.out")"
[ ! -e "$tmp/c/start.0.1.1" ] || fail "exit 2: the replica was restarted"
tail -n 1 "$tmp/c.out" | grep -q 'replica 0 rank 1 exited with status 2 (bad input, which a restart cannot fix' ||
  fail "exit 2: last line: $(tail -n 1 "$tmp/c.out")"
echo "ok: a rank's exit 2 ends the job without a restart"

# 4. --replica-id: this launcher runs replica 2 only.
mkdir "$tmp/d"
SLEEP=0 "$ndmesh" launch --elastic --replicas 3 --replica-id 2 -n 2 --coordinator $coord \
  -- "$tmp/replica.sh" "$tmp/d" > "$tmp/d.out" 2>&1 || fail "--replica-id: $(cat "$tmp/d.out")"
got=$(cd "$tmp/d" && ls start.* | sed 's/^start\.//' | sort | paste -sd' ')
[ "$got" = "2.0.0 2.1.0" ] || fail "--replica-id 2 ran [$got]"
echo "ok: --replica-id 2 runs replica 2 only"

# 5. SIGTERM to the launcher: everything ends, a rank's background child included.
mkdir "$tmp/e"
cat > "$tmp/wrap.sh" << 'EOF'
#!/usr/bin/env bash
sleep "32.$MARKER" &
exec "$@"
EOF
chmod +x "$tmp/wrap.sh"
: > "$tmp/e.out"
SLEEP=33.$marker "$ndmesh" launch --elastic --replicas 2 --max-restarts 2 -n 2 --coordinator $coord \
  -- "$tmp/wrap.sh" "$tmp/replica.sh" "$tmp/e" > "$tmp/e.out" 2>&1 &
job=$!
for _ in $(seq 1 100); do [ "$(ls "$tmp/e" | wc -l)" -eq 4 ] && break; sleep 0.1; done
[ "$(ls "$tmp/e" | wc -l)" -eq 4 ] || fail "signal: the ranks did not start: $(cat "$tmp/e.out")"
sleep 0.3
start=$(now)
kill -TERM $job
wait $job
rc=$?
elapsed=$(since "$start")
[ $rc -eq 143 ] || fail "signal: exit $rc, expected 143: $(cat "$tmp/e.out")"
awk -v e="$elapsed" 'BEGIN{exit !(e < 5)}' || fail "signal: took $elapsed s"
sleep 0.2
left > /dev/null && fail "signal: processes remain: $(ps -o pid,args -p "$(left | paste -sd,)")"
grep -q "starts again" "$tmp/e.out" && fail "signal: a replica was restarted after the launcher's SIGTERM"
echo "ok: SIGTERM to the elastic launcher: exit 143 in ${elapsed} s, nothing left"

# 6. Bad flags: one line naming the flag, exit 2.
bad() {
  local needle=$1 out rc
  shift
  out=$("$ndmesh" launch "$@" 2>&1)
  rc=$?
  [ $rc -eq 2 ] || fail "launch $*: exit $rc, expected 2: $out"
  [ "$(wc -l <<< "$out")" -eq 1 ] || fail "launch $*: not one line: $out"
  [[ "$out" == *"$needle"* ]] || fail "launch $*: no '$needle' in: $out"
}
bad "--elastic needs --replicas R" --elastic -n 2 -- true
bad "--replicas 0 must be between 1" --elastic --replicas 0 -n 2 -- true
bad "--max-restarts -1 must be between 0" --elastic --replicas 2 --max-restarts -1 -n 2 -- true
bad "--min-replicas 3 must be between 1 and --replicas 2" --elastic --replicas 2 --min-replicas 3 -n 2 -- true
bad "--replicas belongs to an elastic launch; add --elastic" --replicas 2 -n 2 -- true
bad "takes no mpirun options (--bind-to none)" --elastic --replicas 2 -n 2 -- --bind-to none -- true
bad "takes no --dry-run" --elastic --replicas 2 -n 2 --dry-run -- true
bad "the program's --dp 2" --elastic --replicas 2 -n 2 -- "$ndmesh" train --dp 2
bad "--coordinator foo is not HOST:PORT" --elastic --replicas 2 -n 2 --coordinator foo -- true
bad "--replica-id 1 runs one replica of a job whose coordinator runs elsewhere" --elastic --replicas 2 -n 2 \
  --replica-id 1 -- true
bad "--replica-id 2 is not one of the replicas 0..1" --elastic --replicas 2 -n 2 --replica-id 2 \
  --coordinator $coord -- true
bad "--min-replicas 2 is for the coordinator this launcher starts" --elastic --replicas 2 -n 2 --min-replicas 2 \
  --coordinator $coord -- true
bad "-n 0 must be at least 1" --elastic --replicas 2 -n 0 -- true
bad "--print-cluster-commands shows an elastic job's commands; add --elastic" --print-cluster-commands -n 2 -- true
bad "takes no --mpirun mpiexec" --elastic --replicas 2 -n 2 --mpirun mpiexec -- true
echo "ok: bad flag combinations get one line each"

# 7. --print-cluster-commands: the coordinator, then one launcher per replica.
out=$("$ndmesh" launch --elastic --replicas 3 --max-restarts 2 -n 4 --coordinator 10.0.0.1:29400 \
  --print-cluster-commands -- ndmesh train --tp 4 --steps 100) || fail "--print-cluster-commands: $out"
grep -qx 'ndmesh coordinator --host 10.0.0.1 --port 29400 --min-replicas 2 --state-file ndmesh-coordinator.state' \
  <<< "$out" || fail "no coordinator command: $out"
for r in 0 1 2; do
  grep -qx "ndmesh launch --elastic --replicas 3 --replica-id $r --coordinator 10.0.0.1:29400 --max-restarts 2 -n 4 -- ndmesh train --tp 4 --steps 100" \
    <<< "$out" || fail "no launcher command for replica $r: $out"
done
echo "ok: --print-cluster-commands"

# 8. With the coordinator started here (--min-replicas 2 of 2): replica 0 finishes, then a
# rank of replica 1 dies: fewer than 2 replicas could take part, so no restart; the
# coordinator ends with the job.
mkdir "$tmp/f"
DIE_REPLICA=1 DIE_UNTIL=5 DIE_AFTER=2 SLEEP=0 "$ndmesh" launch --elastic --replicas 2 --max-restarts 3 -n 2 \
  -- "$tmp/replica.sh" "$tmp/f" > "$tmp/f.out" 2>&1
rc=$?
[ $rc -eq 137 ] || fail "fewer than M: exit $rc, expected 137: $(cat "$tmp/f.out")"
[ "$(tail -n 1 "$tmp/f.out")" = "ndmesh: [launch] replica 1 rank 1 exited with status 137 (SIGKILL); 1 replica finished, so fewer than --min-replicas 2 can take part: the job ends" ] ||
  fail "fewer than M: last line: $(tail -n 1 "$tmp/f.out")"
[ ! -e "$tmp/f/start.1.1.1" ] || fail "fewer than M: replica 1 was restarted"
port=$(sed -n 's/^\[coordinator\] coordinator listening on 127.0.0.1:\([0-9]*\)$/\1/p' "$tmp/f.out")
[ -n "$port" ] || fail "fewer than M: no coordinator line: $(cat "$tmp/f.out")"
python3 -c "import socket; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1);
s.bind(('127.0.0.1', $port)); s.listen()" || fail "fewer than M: the coordinator's port $port is not free"
sleep 0.2
left > /dev/null && fail "fewer than M: processes remain: $(ps -o pid,args -p "$(left | paste -sd,)")"
echo "ok: fewer than --min-replicas left: no restart, the job ends; the coordinator started here ended"
echo PASS
