# Shared by the elastic tests (sourced): a coordinator and replicas under mpirun, and the
# replicas' committed steps. Needs: tmp, pids (an array the caller's cleanup kills), fail,
# ndmesh, mpirun (an array), flags (the train flags of every replica).
elastic_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$elastic_here/../support/compare_runs.sh"

start_coordinator() {  # start_coordinator <name>:<port> [flags...]: sets coord_pid and addr
  local name=${1%%:*} port=${1#*:}
  shift
  "$ndmesh" coordinator --port "$port" --min-replicas 2 --heartbeat-timeout-s 2 "$@" \
    > "$tmp/$name.out" 2> "$tmp/$name.err" &
  coord_pid=$!
  pids+=("$coord_pid")
  for _ in $(seq 100); do
    grep -q "^coordinator listening on " "$tmp/$name.out" && break
    sleep 0.1
  done
  addr=$(sed -n 's/^coordinator listening on //p' "$tmp/$name.out")
  [ -n "$addr" ] || fail "the coordinator did not print its address"
}

start_replica() {  # start_replica <id> <name> [VAR=value...] [-- extra train flags...]: sets rpid
  local r=$1 name=$2 env_vars=() extra=()
  shift 2
  while [ $# -gt 0 ] && [ "$1" != -- ]; do env_vars+=("$1"); shift; done
  [ $# -gt 0 ] && { shift; extra=("$@"); }
  env NDMESH_COORDINATOR="$addr" NDMESH_REPLICA_ID="$r" "${env_vars[@]}" \
    timeout -k 5 200 "${mpirun[@]}" -np 2 "$ndmesh" train ${ELASTIC_TEST_LAYOUT:---tp 2} "${flags[@]}" "${extra[@]}" \
    > "$tmp/$name.out" 2> "$tmp/$name.err" &
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

# elastic_against_serial <label> <steps> <replica outputs...>: the committed steps
# (committed_steps.py) into $tmp/elastic.json, the serial run of the same flags into
# $tmp/serial.json, and compare_runs.sh's expect_same between them.
elastic_against_serial() {
  local label=$1 steps=$2
  shift 2
  python3 "$elastic_here/committed_steps.py" "$steps" "$@" > "$tmp/elastic.json" ||
    fail "the committed steps (above)"
  timeout 120 "$ndmesh" train "${flags[@]}" > "$tmp/serial.out" 2> "$tmp/serial.err" || fail "the serial run failed"
  tail -n 1 "$tmp/serial.out" > "$tmp/serial.json"
  expect_same "$label" "$tmp/serial.json" "$tmp/elastic.json"
}
