#!/usr/bin/env bash
# ndmesh ranks at a c10d TCPStore of the generation whose every query opens with a magic
# (PyTorch 2.x before VALIDATE), emulated from PyTorch's sources by query_magic_store.py
# (no installed PyTorch serves it): the ranks identify it, name it, and train equal to
# the serial run. A server that answers no generation ends the ranks with one line that
# names every probe, within NDMESH_INIT_TIMEOUT_S.
#   query_magic.sh <ndmesh> <python3>
set -uo pipefail
ndmesh=$1
python=$2
here=$(cd "$(dirname "$0")" && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
server=
cleanup() {
  [ -n "$server" ] && kill "$server" 2> /dev/null && wait "$server" 2> /dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
# Starts the emulated server with $@, sets $port.
start_server() {
  [ -n "$server" ] && kill "$server" 2> /dev/null && wait "$server" 2> /dev/null
  "$python" "$here/query_magic_store.py" "$@" > "$tmp/port" &
  server=$!
  for _ in $(seq 100); do
    port=$(sed -n 's/^port //p' "$tmp/port")
    [ -n "$port" ] && return
    sleep 0.1
  done
  fail "the emulated server did not start"
}
model=(--layers 2 --hidden 32 --heads 4 --kv-heads 2 --seq 16 --markov-vocab 16 --threads 1 --eval-batches 0
  --batch 8 --steps 3 --seed 515 --json)
"$ndmesh" train "${model[@]}" 2> /dev/null | tail -n 1 > "$tmp/serial.json" || fail "serial run"
agent=(--set 0:TORCHELASTIC_USE_AGENT_STORE=True --set 1:TORCHELASTIC_USE_AGENT_STORE=True)

start_server
NDMESH_LOG=debug timeout -k 5 120 "$python" "$here/torchrun_env.py" -np 2 --master-port "$port" "${agent[@]}" \
  "$ndmesh" train "${model[@]}" --dp 2 > "$tmp/out" 2> "$tmp/err" ||
  fail "ranks at the query-magic store: $(grep -v '^\[debug\]' "$tmp/err" | tail -n 3)"
met=$(grep -c "ranks met at .* (c10d protocol query magic)" "$tmp/err")
[ "$met" -ge 1 ] || fail "no rank named the query-magic generation: $(grep 'ranks met' "$tmp/err" | head -n 2)"
grep "^{" "$tmp/out" | tail -n 1 > "$tmp/par.json"
echo -n "ranks at the emulated query-magic store ($met said so): "
"$python" "$here/compare_runs.py" "$tmp/serial.json" "$tmp/par.json" || fail "the job differs from the serial run"

# A server that reads and never answers: one line naming the probes, within the bound.
start_server --silent
start=$(date +%s)
NDMESH_INIT_TIMEOUT_S=12 timeout -k 5 60 "$python" "$here/torchrun_env.py" -np 2 --master-port "$port" "${agent[@]}" \
  "$ndmesh" train "${model[@]}" --dp 2 > "$tmp/out" 2> "$tmp/err"
rc=$?
took=$(($(date +%s) - start))
[ "$rc" -ne 0 ] || fail "ranks at a silent server succeeded"
[ "$took" -le 40 ] || fail "ranks at a silent server took $took s (NDMESH_INIT_TIMEOUT_S=12)"
grep -q "answered no c10d TCPStore generation: PyTorch 2.x's VALIDATE + PING: no answer" "$tmp/err" ||
  fail "no line naming the probes: $(tail -n 3 "$tmp/err")"
echo "a silent server: exit $rc after $took s: $(grep -m 1 'answered no c10d' "$tmp/err" | cut -c 1-160)..."
echo PASS
