# Shared by the train_*.sh tests (sourced: `source "$(dirname "$0")/train_lib.sh" "$@"`).
# Arguments of the test: <mpirun command...> <path to ndmesh>. Sets ndmesh, mpirun and tmp
# (a folder removed at exit) and defines fail, max_rel, max_rel_from, expect_close and
# expect_train_usage.
set -euo pipefail
ndmesh=${*: -1}
mpirun=("${@:1:$#-1}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# max_rel <a.json> <b.json> [field...]: the largest relative difference between two runs'
# per-step losses (and the named scalar fields, e.g. final_loss), relative to the first.
max_rel() {
  local a=$1 b=$2 fields="" f
  shift 2
  for f in "$@"; do fields+=" + [.$f]"; done
  jq -n --slurpfile a "$a" --slurpfile b "$b" \
    "[(\$a[0] | .losses$fields), (\$b[0] | .losses$fields)] | transpose
     | map((.[0] - .[1]) / .[0] | if . < 0 then -. else . end) | max"
}

# max_rel_from <full.json> <resumed.json> <k>: the same for a run resumed after step k,
# against the uninterrupted run's losses from step k + 1 on.
max_rel_from() {
  jq -n --slurpfile a "$1" --slurpfile b "$2" --argjson k "$3" \
    '[$a[0].losses[$k:], $b[0].losses] | transpose | map((.[0] - .[1]) / .[0] | if . < 0 then -. else . end) | max'
}

# expect_close <what> <difference>: prints the difference, fails unless it is below 1e-5.
expect_close() {
  echo "$1: max relative loss difference $2"
  awk -v d="$2" 'BEGIN{exit !(d < 1e-5)}' || fail "$1 differs by $2 (the bound is 1e-5)"
}

# expect_train_usage <needle> <ranks> <flags...>: `ndmesh train <flags>` on that many ranks
# exits 2 at once and says the needle.
expect_train_usage() {
  local needle=$1 np=$2
  shift 2
  set +e
  timeout 60 "${mpirun[@]}" -np "$np" "$ndmesh" train "$@" > "$tmp/out.txt" 2>&1
  local rc=$?
  set -e
  [ "$rc" -eq 2 ] || fail "'$*' on $np ranks exited $rc, expected 2: $(cat "$tmp/out.txt")"
  grep -qF -- "$needle" "$tmp/out.txt" || fail "'$*' did not say '$needle': $(cat "$tmp/out.txt")"
}
