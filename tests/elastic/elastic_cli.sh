#!/usr/bin/env bash
# The elastic contract's edges: `ndmesh coordinator` prints its address, exits 0 on SIGTERM
# and refuses bad flags and a corrupt state file in one line; `ndmesh train` as a replica
# refuses what cannot be elastic (offload, a missing replica id, a malformed address) in one line, and a replica whose coordinator is gone stops with a
# line naming it. Usage: elastic_cli.sh <mpirun command...> <path to ndmesh>
set -euo pipefail
ndmesh=${*: -1}
mpirun=("${@:1:$#-1}")
tmp=$(mktemp -d)
coord=""
trap '[ -n "$coord" ] && kill "$coord" 2> /dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# expect <rc> <needle> <command...>: exits rc within 60 s, one line of stderr saying the needle.
expect() {
  local rc=$1 needle=$2 got
  shift 2
  set +e
  timeout 60 "$@" > "$tmp/out" 2> "$tmp/err"
  got=$?
  set -e
  [ "$got" -eq "$rc" ] || fail "'$*' exited $got, expected $rc: $(cat "$tmp/out" "$tmp/err")"
  grep -qF -- "$needle" "$tmp/err" || fail "'$*' did not say '$needle': $(cat "$tmp/err")"
}

expect 2 "--min-replicas=0" "$ndmesh" coordinator --port 0 --min-replicas 0
expect 2 "--port=70000" "$ndmesh" coordinator --port 70000 --min-replicas 1
expect 2 "--host=10.255.255.254 is not an address of this host" "$ndmesh" coordinator --port 0 --min-replicas 1 \
  --host 10.255.255.254
echo '{"generation": "x"' > "$tmp/bad.json"
expect 2 "--state-file=$tmp/bad.json" "$ndmesh" coordinator --port 0 --min-replicas 1 --state-file "$tmp/bad.json"

# The listening line, then exit 0 on SIGTERM.
"$ndmesh" coordinator --port 0 --min-replicas 1 > "$tmp/coord.out" 2> "$tmp/coord.err" &
coord=$!
for _ in $(seq 100); do grep -q "^coordinator listening on 127.0.0.1:[0-9]" "$tmp/coord.out" && break; sleep 0.1; done
addr=$(sed -n 's/^coordinator listening on //p' "$tmp/coord.out")
[ -n "$addr" ] || fail "no 'coordinator listening on HOST:PORT' line: $(cat "$tmp/coord.out" "$tmp/coord.err")"
[ "$(wc -l < "$tmp/coord.out")" -eq 1 ] || fail "the coordinator printed more than one line on stdout"

small=(--steps 2 --batch 4 --layers 1 --hidden 32 --heads 4 --seq 16 --threads 1)
expect 2 "--offload=optimizer with a coordinator" "$ndmesh" train --coordinator "$addr" --replica-id 0 \
  --offload optimizer --offload-dir "$tmp" "${small[@]}"
expect 2 "NDMESH_REPLICA_ID" env NDMESH_COORDINATOR="$addr" "$ndmesh" train "${small[@]}"
expect 2 "--coordinator=nowhere is not HOST:PORT" "$ndmesh" train --coordinator nowhere --replica-id 0 "${small[@]}"
expect 2 "NDMESH_REPLICA_ID='-1'" env NDMESH_COORDINATOR="$addr" NDMESH_REPLICA_ID=-1 "$ndmesh" train "${small[@]}"
expect 2 "--replica-id: Value -3 not in range 0 to 1048576" "$ndmesh" train --coordinator "$addr" --replica-id -3 "${small[@]}"

# One replica with --min-replicas 1 trains; then the coordinator is stopped: exit 0.
NDMESH_COORDINATOR="$addr" NDMESH_REPLICA_ID=0 timeout 60 "$ndmesh" train "${small[@]}" --json > "$tmp/one.out" \
  2> "$tmp/one.err" || fail "a lone replica failed: $(cat "$tmp/one.err")"
grep -q '"elastic_step":2,' "$tmp/one.out" || fail "the lone replica did not commit step 2: $(cat "$tmp/one.out")"
kill -TERM "$coord"
set +e
wait "$coord"
rc=$?
set -e
coord=""
[ "$rc" -eq 0 ] || fail "the coordinator exited $rc on SIGTERM, expected 0"

# Nothing listens there any more: the replica stops with a line naming the address.
expect 1 "the coordinator at $addr is gone" env NDMESH_ELASTIC_RECONNECT_S=1 NDMESH_COORDINATOR="$addr" \
  NDMESH_REPLICA_ID=0 "$ndmesh" train "${small[@]}"
echo PASS
