#!/usr/bin/env bash
# `ndmesh launch --store` leaves nothing behind: SIGTERM or SIGINT sent to the launcher in
# the middle of training reaches every rank (exit 128 + the signal); a rank that ignores
# SIGTERM gets SIGKILL after the grace period (NDMESH_TIMEOUT_S / 4, here 2 s); a rank
# started through `bash -c` with a child of its own in the background leaves no process,
# whether the job is signalled or ends by itself. Afterwards no process of the job remains
# and the store's port can be listened on again. The same for `ndmesh launch --elastic`
# (every replica and the coordinator end, its port is free too). Also `ndmesh launch`
# (mpirun) passes on a SIGINT sent to it alone.
#   launch_signals.sh <ndmesh>
set -uo pipefail
ndmesh=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
marker=7117
trap 'pkill -9 -f -- "--seed $marker" 2>/dev/null; pkill -9 -f "sleep 999.$marker" 2>/dev/null; rm -rf "$tmp"' EXIT
export NDMESH_TIMEOUT_S=8
train=("$ndmesh" train --layers 2 --hidden 32 --heads 4 --kv-heads 2 --seq 16 --markov-vocab 16 --threads 1
  --eval-batches 0 --batch 8 --seed $marker --steps 1000000 --dp 2)
left() { pgrep -f -- "--seed $marker|sleep 999.$marker"; }

# run_and_signal <label> <signal> <expected status> <max seconds after the signal> <launch args...>
run_and_signal() {
  local label=$1 sig=$2 want=$3 limit=$4 job port start rc elapsed rank_pid
  shift 4
  : > "$tmp/out.txt"  # emptied here: the job's own redirection may come after the first grep below
  "$@" > "$tmp/out.txt" 2>&1 &
  job=$!
  for _ in $(seq 1 600); do
    grep -q 'step 3/' "$tmp/out.txt" 2>/dev/null && break
    kill -0 "$job" 2>/dev/null || fail "$label: ended before the signal: $(cat "$tmp/out.txt")"
    sleep 0.1
  done
  grep -q 'step 3/' "$tmp/out.txt" || fail "$label: no step 3 in 60 s: $(cat "$tmp/out.txt")"
  port=""
  for rank_pid in $(pgrep -f -- "--seed $marker"); do
    [ -n "$port" ] || port=$(tr '\0' '\n' < "/proc/$rank_pid/environ" 2> /dev/null | sed -n 's/^MASTER_PORT=//p')
  done
  start=$(date +%s.%N)
  kill -s "$sig" "$job"
  for _ in $(seq 1 300); do kill -0 "$job" 2>/dev/null || break; sleep 0.05; done
  kill -0 "$job" 2>/dev/null && { kill -9 "$job"; fail "$label: the launcher still runs 15 s after SIG$sig"; }
  wait "$job"
  rc=$?
  elapsed=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b - a}')
  [ "$rc" -eq "$want" ] || fail "$label: exit $rc, expected $want: $(tail -n 5 "$tmp/out.txt")"
  awk -v e="$elapsed" -v l="$limit" 'BEGIN{exit !(e < l)}' || fail "$label: took ${elapsed} s (limit $limit s)"
  sleep 0.2
  left > /dev/null && fail "$label: processes of the job remain: $(ps -o pid,pgid,args -p "$(left | paste -sd,)")"
  [[ "$label" == *mpirun* ]] && { echo "ok: $label: exit $rc ${elapsed} s after SIG$sig, nothing left"; return; }
  [ -n "$port" ] || fail "$label: no MASTER_PORT in the rank's environment"
  free "$port" || fail "$label: the store's port $port is not free"
  # An elastic launch's coordinator: its port is free too (it ended).
  coord=$(sed -n 's/^\[coordinator\] coordinator listening on 127.0.0.1:\([0-9]*\)$/\1/p' "$tmp/out.txt")
  [[ "$label" != *elastic* ]] || [ -n "$coord" ] || fail "$label: no coordinator line: $(head -n 3 "$tmp/out.txt")"
  [ -z "$coord" ] || free "$coord" || fail "$label: the coordinator's port $coord is not free"
  [ -z "$coord" ] || port="$port and the coordinator's $coord"
  echo "ok: $label: exit $rc ${elapsed} s after SIG$sig, nothing left, port $port free"
}
free() {
  python3 -c "import socket; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1);
s.bind(('127.0.0.1', $1)); s.listen()"
}

launch=("$ndmesh" launch --store -n 2 --)
run_and_signal "SIGTERM to the launcher" TERM 143 5 "${launch[@]}" "${train[@]}"
run_and_signal "SIGINT to the launcher" INT 130 5 "${launch[@]}" "${train[@]}"
# shellcheck disable=SC2016
run_and_signal "a rank ignoring SIGTERM" TERM 143 6 "${launch[@]}" bash -c 'trap "" TERM; exec "$@"' rank \
  "${train[@]}"
# shellcheck disable=SC2016
run_and_signal "ranks wrapped in bash -c with a child" TERM 143 5 "${launch[@]}" \
  bash -c 'sleep 999.'$marker' & "$@"; exit $?' rank "${train[@]}"
# --elastic: the coordinator and every replica end (2 replicas of tp 2; then every rank
# wrapped, with a child of its own).
elastic=("$ndmesh" launch --elastic --replicas 2 --max-restarts 3 -n 2 --)
run_and_signal "SIGTERM to the elastic launcher" TERM 143 5 "${elastic[@]}" "${train[@]/#--dp/--tp}"
# shellcheck disable=SC2016
run_and_signal "SIGINT to the elastic launcher, ranks wrapped in bash -c with a child" INT 130 5 "${elastic[@]}" \
  bash -c 'sleep 999.'$marker' & "$@"; exit $?' rank "${train[@]/#--dp/--tp}"
# A job that ends by itself: the wrapped ranks' children end with it.
# shellcheck disable=SC2016
"$ndmesh" launch --store -n 2 -- bash -c 'sleep 999.'$marker' & exec "$@"' rank "$ndmesh" check --tp 2 \
  > "$tmp/out.txt" 2>&1 || fail "wrapped check: $(cat "$tmp/out.txt")"
sleep 0.2
left > /dev/null && fail "a finished job left: $(ps -o pid,args -p "$(left | paste -sd,)")"
echo "ok: a finished job's wrapped ranks left no child"

# mpirun mode: a SIGINT to the launcher alone (not the terminal's) ends the job.
if command -v mpirun > /dev/null; then
  run_and_signal "SIGINT to ndmesh launch (mpirun)" INT 130 8 "$ndmesh" launch -n 2 -- "${train[@]}"
fi
echo PASS
