#!/usr/bin/env bash
# `ndmesh schedule`: the timeline and numbers for every schedule, JSON values against the
# closed forms, an SVG that a real renderer (rsvg-convert) accepts, and bad flags that
# exit 2 with one line naming the flag, the value and the fix.
# Usage: bash tests/cli/schedule.sh path/to/ndmesh
set -u
ndmesh=$1
failures=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
expect_rc() {  # expect_rc CODE DESCRIPTION -- command...
  local want=$1 what=$2; shift 3
  out=$("$@" 2>"$tmp/err"); rc=$?
  err=$(cat "$tmp/err")
  [ "$rc" -eq "$want" ] || fail "$what: exit $rc, want $want; stdout: $out; stderr: $err"
}
near() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 1e-9) }'; }

# Text output: a row per stage, the numbers, no colour codes when stdout is not a terminal.
expect_rc 0 "1f1b text" -- "$ndmesh" schedule --pp 4 --microbatches 8 --schedule 1f1b
rows=$(echo "$out" | grep -c '^stage [0-3] |')
[ "$rows" -eq 4 ] || fail "1f1b text: want 4 stage rows, got $rows: $out"
echo "$out" | grep -q "makespan 33, bubble fraction 0.2727" || fail "1f1b text: numbers: $out"
echo "$out" | grep -q "in flight per stage (micro-batches): 4 3 2 1" || fail "1f1b text: peaks: $out"
echo "$out" | grep -q '^stage 3 |.  .  .  F0 B0 -- F1 B1 --' || fail "1f1b text: last stage row: $out"
if printf '%s' "$out" | grep -q $'\x1b'; then fail "1f1b text: ANSI codes on a pipe"; fi
expect_rc 0 "colour" -- "$ndmesh" schedule --pp 2 -m 2 --color always
printf '%s' "$out" | grep -q $'\x1b\[44;97mF0' || fail "colour: no coloured forward cell: $out"

# JSON against the closed forms, over several shapes.
check_json() {  # check_json SCHEDULE P M V BUBBLE MAKESPAN PEAKS(jq array)
  local args=(--pp "$2" -m "$3" --schedule "$1")
  [ "$4" -gt 1 ] && args+=(--vpp "$4")
  expect_rc 0 "json $*" -- "$ndmesh" schedule "${args[@]}" --json
  local got
  got=$(echo "$out" | jq -r '.bubble_fraction')
  near "$got" "$5" || fail "json $*: bubble_fraction $got, want $5"
  got=$(echo "$out" | jq -r '.makespan')
  near "$got" "$6" || fail "json $*: makespan $got, want $6"
  echo "$out" | jq -e --argjson want "$7" '.peak_in_flight == $want' >/dev/null ||
    fail "json $*: peak_in_flight $(echo "$out" | jq -c .peak_in_flight), want $7"
}
for pm in "2 1" "3 5" "4 8" "5 3" "8 16"; do
  set -- $pm
  p=$1 m=$2
  b=$(awk -v p="$p" -v m="$m" 'BEGIN { printf "%.15f", (p - 1) / (m + p - 1) }')
  ms=$((3 * (m + p - 1)))
  gpipe_peaks=$(jq -nc --argjson p "$p" --argjson m "$m" '[range($p)] | map($m)')
  ofob_peaks=$(jq -nc --argjson p "$p" --argjson m "$m" '[range($p)] | map([$p - ., $m] | min)')
  check_json gpipe "$p" "$m" 1 "$b" "$ms" "$gpipe_peaks"
  check_json 1f1b "$p" "$m" 1 "$b" "$ms" "$ofob_peaks"
done
for pm in "2 4" "4 8" "3 9" "8 16"; do  # ZB-H1 with m >= p: bubble (p-1)/(3m+p-1)
  set -- $pm
  p=$1 m=$2
  b=$(awk -v p="$p" -v m="$m" 'BEGIN { printf "%.15f", (p - 1) / (3 * m + p - 1) }')
  peaks=$(jq -nc --argjson p "$p" --argjson m "$m" '[range($p)] | map([$p - ., $m] | min)')
  check_json zb-h1 "$p" "$m" 1 "$b" "$((3 * m + p - 1))" "$peaks"
done
for pmv in "2 4 2" "4 8 2" "4 8 4" "3 6 3"; do  # interleaved: ((p-1)/v)/(m+(p-1)/v)
  set -- $pmv
  p=$1 m=$2 v=$3
  b=$(awk -v p="$p" -v m="$m" -v v="$v" 'BEGIN { x = (p - 1) / v; printf "%.15f", x / (m + x) }')
  ms=$(awk -v p="$p" -v m="$m" -v v="$v" 'BEGIN { printf "%.15f", 3 * (m + (p - 1) / v) }')
  # Megatron's warm-up (p-r-1)*2 + (v-1)*p plus one, in chunks of 1/v micro-batch.
  peaks=$(jq -nc --argjson p "$p" --argjson m "$m" --argjson v "$v" \
    '[range($p)] | map([(($p - . - 1) * 2 + ($v - 1) * $p + 1), $m * $v] | min / $v)')
  check_json interleaved "$p" "$m" "$v" "$b" "$ms" "$peaks"
done
expect_rc 0 "json actions" -- "$ndmesh" schedule --pp 3 -m 4 --schedule zb-h1 --json
n=$(echo "$out" | jq '[.actions[][] | select(.kind == "backward-weight")] | length')
[ "$n" -eq 12 ] || fail "json actions: want 12 backward-weight actions, got $n"
n=$(echo "$out" | jq '[.actions[][] | select(.kind == "send-activation")] | length')
[ "$n" -eq 8 ] || fail "json actions: want 8 activation sends (2 boundaries x 4), got $n"

# Non-default costs: GPipe makespan (m+p-1)(F+B+W) for any costs.
expect_rc 0 "costs" -- "$ndmesh" schedule --pp 3 -m 4 --schedule gpipe --cost-forward 2 \
  --cost-backward-input 1.5 --cost-backward-weight 0.5 --json
got=$(echo "$out" | jq -r .makespan)
near "$got" 24 || fail "costs: makespan $got, want (4+3-1)*(2+1.5+0.5) = 24"

# SVG: one rectangle per compute action, and rsvg-convert renders it.
expect_rc 0 "svg" -- "$ndmesh" schedule --pp 4 -m 8 --schedule gpipe --svg "$tmp/g.svg"
echo "$out" | grep -q "wrote $tmp/g.svg" || fail "svg: no 'wrote' line: $out"
n=$(grep -c '<rect [^>]*><title>\(forward\|backward\)' "$tmp/g.svg")
[ "$n" -eq 64 ] || fail "svg: want 64 action rectangles (4 stages x 8 x F,B), got $n"
if command -v rsvg-convert >/dev/null; then
  rsvg-convert "$tmp/g.svg" -o "$tmp/g.png" || fail "svg: rsvg-convert rejected the SVG"
  [ -s "$tmp/g.png" ] || fail "svg: empty PNG"
else
  fail "svg: rsvg-convert is not installed (Debian librsvg2-bin, in the Makefile's deps)"
fi

# Bad input: exit 2, one line on stderr naming the flag, the value and the fix.
bad() {  # bad DESCRIPTION "needle1|needle2|..." -- args...
  local what=$1 needles=$2; shift 3
  expect_rc 2 "$what" -- "$ndmesh" schedule "$@"
  lines=$(printf '%s\n' "$err" | grep -c .)
  [ "$lines" -eq 1 ] || fail "$what: want one line on stderr, got $lines: $err"
  IFS='|' read -ra parts <<<"$needles"
  for part in "${parts[@]}"; do
    printf '%s' "$err" | grep -qF -- "$part" || fail "$what: stderr lacks '$part': $err"
  done
}
bad "pp 0" "pp=0|pp=1" -- --pp 0
bad "microbatches 0" "microbatches=0|use microbatches=" -- --microbatches 0
bad "unknown schedule" "--schedule 'pipedream'|gpipe, 1f1b, interleaved, zb-h1" -- --schedule pipedream
bad "interleaved multiple" "microbatches=6|pp=4|microbatches=8" -- --pp 4 -m 6 --schedule interleaved
bad "vpp without interleaved" "vpp=2|interleaved" -- --vpp 2 --schedule 1f1b
bad "interleaved vpp 1" "vpp=1|vpp=2" -- --vpp 1 --schedule interleaved
bad "negative cost" "cost-forward=-1|cost-forward=1" -- --cost-forward -1
bad "negative p2p" "cost-p2p=-0.5|cost-p2p=0" -- --cost-p2p -0.5
bad "svg path" "--svg $tmp/missing/x.svg|writable folder" -- --svg "$tmp/missing/x.svg"
bad "colour" "--color 'sometimes'|auto, always or never" -- --color sometimes
# Type errors come from CLI11, worded by main.cpp: the flag, the value, what it takes.
expect_rc 2 "pp not a number" -- "$ndmesh" schedule --pp four
printf '%s' "$err" | grep -q -- "--pp=four is not a whole number" || fail "pp not a number: stderr: $err"
bad "huge" "exceeds" -- --pp 200 -m 100000

[ "$failures" -eq 0 ] && echo "schedule CLI: all checks passed"
exit $((failures > 0))
