#!/usr/bin/env bash
# The comparison every equivalence test uses (compare_runs.sh) fails when either run has
# no numbers to compare: a serial run that crashed (empty file, an error text), printed
# JSON without losses or gradient norms, fewer steps, or nulls. Each comparison in the
# tests goes through expect_same, so a broken serial run fails each of them. Also: two
# equal runs pass, a loss or a step-1 norm off by 1e-3 fails.
set -uo pipefail
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
source "$(dirname "$0")/compare_runs.sh"

good='{"losses":[2.0,1.9,1.8],"grad_norms":[1.0,0.9,0.8],"final_loss":1.8}'
echo "$good" > "$tmp/run.json"
echo "$good" > "$tmp/serial.json"
( expect_same "equal runs" "$tmp/serial.json" "$tmp/run.json" ) || fail "two equal runs must compare equal"

n=0
rejects() {  # rejects <what> <serial file contents> [run file contents]
  printf '%s' "$2" > "$tmp/bad.json"
  printf '%s\n' "${3:-$good}" > "$tmp/other.json"
  local out
  if out=$( (expect_same "$1" "$tmp/bad.json" "$tmp/other.json") 2>&1); then
    fail "'$1' passed the comparison: $out"
  fi
  # and the other way round (the broken run second)
  if [ -z "${3:-}" ] && out=$( (expect_same "$1" "$tmp/other.json" "$tmp/bad.json") 2>&1); then
    fail "'$1' as the second run passed the comparison: $out"
  fi
  echo "rejected: $1: $(tail -n 1 <<< "$out")"
  n=$((n + 1))
}
rejects "an empty serial output (the run crashed)" ""
rejects "an error text instead of JSON" "Segmentation fault (core dumped)"
rejects "JSON without losses" '{"grad_norms":[1.0,0.9,0.8]}'
rejects "JSON without gradient norms" '{"losses":[2.0,1.9,1.8]}'
rejects "empty lists" '{"losses":[],"grad_norms":[]}'
rejects "both runs empty lists" '{"losses":[],"grad_norms":[]}' '{"losses":[],"grad_norms":[]}'
rejects "fewer steps" '{"losses":[2.0,1.9],"grad_norms":[1.0,0.9]}'
rejects "a null loss" '{"losses":[2.0,null,1.8],"grad_norms":[1.0,0.9,0.8]}'
rejects "a string norm" '{"losses":[2.0,1.9,1.8],"grad_norms":[1.0,"nan",0.8]}'
rejects "a loss off by 1e-3" '{"losses":[2.0,1.9019,1.8],"grad_norms":[1.0,0.9,0.8]}'
rejects "a step-1 norm off by 1e-3" '{"losses":[2.0,1.9,1.8],"grad_norms":[1.001,0.9,0.8]}'
( expect_numbers "three steps" "$tmp/serial.json" 3 ) || fail "expect_numbers refuses a good run"
! ( expect_numbers "four steps" "$tmp/serial.json" 4 ) 2> /dev/null || fail "expect_numbers accepts a wrong step count"
echo "$n broken runs rejected"
echo PASS
