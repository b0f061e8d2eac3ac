# Shared by the train_*.sh tests (sourced: `source "$(dirname "$0")/train_lib.sh" "$@"`).
# Arguments of the test: <mpirun command...> <path to ndmesh>. Sets ndmesh, mpirun (each
# launch bounded in time, under `timeout`) and tmp (a folder removed at exit) and defines
# fail and expect_train_usage, and sources the comparison with the serial run
# (tests/support/compare_runs.sh: expect_same, expect_numbers, max_rel, run_diffs).
set -euo pipefail
ndmesh=${*: -1}
# Every launch is bounded on its own (TRAIN_RUN_TIMEOUT_S, default 300 s), so a run that
# hangs fails with its layout's name (the callers print it with the exit status: 124 is a
# communication timeout or this bound) instead of the whole ctest timing out.
mpirun=(timeout -k 10 "${TRAIN_RUN_TIMEOUT_S:-300}" "${@:1:$#-1}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Under the sanitizers, LeakSanitizer's check at exit runs in the serial runs and the first
# multi-rank run of a test, not in the later ones (about half of their CPU there; the code
# they add is leak-checked in the in-process tests): tests/sanitize/leak_check_once.sh.
if [[ ${ASAN_OPTIONS:-} == *detect_leaks=1* ]]; then
  mpirun=(bash "$(dirname "${BASH_SOURCE[0]}")/../sanitize/leak_check_once.sh" "$tmp/leak-checked" "${mpirun[@]}")
fi
fail() { echo "FAIL: $*" >&2; exit 1; }

# The comparison with the serial run (bounds, max_rel, run_diffs, expect_same).
source "$(dirname "${BASH_SOURCE[0]}")/../support/compare_runs.sh"

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

# The serial run and a layout of the same flags, for scripts that set `common` (the flags of
# every run) and `steps` (the steps they train):
# serial_run <name> <flags...>: `ndmesh train "${common[@]}" <flags>` alone; its output in
# $tmp/<name>.out, its JSON summary in $tmp/<name>.json, which must hold $steps losses.
serial_run() {
  local name=$1
  shift
  "$ndmesh" train "${common[@]}" "$@" > "$tmp/$name.out" 2> "$tmp/$name.err" ||
    fail "serial $name: $(tail -n 5 "$tmp/$name.err")"
  tail -n 1 "$tmp/$name.out" > "$tmp/$name.json"
  jq -e --argjson n "$steps" '.losses | length == $n' "$tmp/$name.json" > /dev/null || fail "serial $name has no $steps losses"
}
# layout_run <serial name> <ranks> <name> <flags...>: the same under mpirun on <ranks> ranks,
# $steps losses, equal to that serial run within compare_runs.sh's bounds (expect_same).
layout_run() {
  local base=$1 np=$2 name=$3
  shift 3
  "${mpirun[@]}" -np "$np" "$ndmesh" train "${common[@]}" "$@" > "$tmp/$name.out" 2> "$tmp/$name.err" ||
    fail "$name: exit $? $(cat "$tmp/$name.err")"
  tail -n 1 "$tmp/$name.out" > "$tmp/$name.json"
  jq -e --argjson n "$steps" '.losses | length == $n' "$tmp/$name.json" > /dev/null || fail "$name has no $steps losses"
  expect_same "$name vs serial $base" "$tmp/$base.json" "$tmp/$name.json"
}
