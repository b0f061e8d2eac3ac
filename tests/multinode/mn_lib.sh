# Shared by the multi-node tests (sourced: `source "$(dirname "$0")/mn_lib.sh" "$@"`).
# Arguments of a test: <path to ndmesh> [more]. Skips (exit 77, with the reason) where
# the harness cannot run; otherwise sets ndmesh and tmp, defines fail, elapsed_since,
# mn_cluster (a cluster taken down at exit, whatever happens) and wait_for.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/harness.sh"
ndmesh=$1
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
reason=$(mn_probe) || {
  echo "$reason"
  exit 77
}
tmp=$(mktemp -d)
mn_clusters=()
mn_teardown() {
  local c
  for c in "${mn_clusters[@]}"; do mn_down "$c"; done
  rm -rf "$tmp"
}
trap mn_teardown EXIT
trap 'exit 143' TERM INT

# mn_cluster VAR mn_up-options...: creates a cluster, stores its id in VAR.
mn_cluster() {
  local var=$1 id
  shift
  id=$(mn_up "$@") || fail "cannot create the cluster ($*)"
  mn_clusters+=("$id")
  printf -v "$var" '%s' "$id"
}

# elapsed_since <date +%s.%N value>: seconds since then, two decimals.
elapsed_since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b - a}'; }

# wait_for <seconds> <pid> <command...>: polls the command every 0.1 s until it succeeds;
# fails when pid (the job) ends first or the time runs out.
wait_for() {
  local limit=$1 pid=$2 i
  shift 2
  for ((i = 0; i < limit * 10; i++)); do
    "$@" && return 0
    kill -0 "$pid" 2> /dev/null || return 1
    sleep 0.1
  done
  return 1
}
