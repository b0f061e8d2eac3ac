#!/usr/bin/env bash
# Huge values never hang: the work is proportional to what is printed (long member lists
# abbreviated, counts instead of lists), or the input is refused naming the limit.
set -uo pipefail
ndmesh=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# run <max seconds> <max output bytes> <args...>: exit 0, in time, output small.
run() {
  local secs=$1 bytes=$2
  shift 2
  timeout "$secs" "$ndmesh" "$@" >"$tmp/out" 2>&1 || fail "ndmesh $* exited $? (or ran past ${secs} s)"
  [ "$(wc -c <"$tmp/out")" -le "$bytes" ] || fail "ndmesh $* printed $(wc -c <"$tmp/out") bytes"
}

run 10 20000 mesh --dp 2147483648
grep -q "(2147483648 ranks)" "$tmp/out" || fail "the dp group is not abbreviated with its count"
run 10 20000 mesh --dp 67108864 --rank 5
grep -q "(67108864 ranks)" "$tmp/out" || fail "--rank: the dp group is not abbreviated"
run 10 20000 mesh --dp 2147483648 --ranks-per-node 8
grep -q "placement report skipped" "$tmp/out" || fail "no note that the placement report was skipped"
run 10 20000 mesh --dp 2 --ranks-per-node 9223372036854775807
grep -q "1 node$" "$tmp/out" || fail "node count: $(head -2 "$tmp/out")"
# A send a trillion times a forward: drawn in at most the terminal's columns.
run 10 20000 schedule --cost-p2p 1e12 --svg "$tmp/p2p.svg"
[ -s "$tmp/p2p.svg" ] || fail "no SVG written"
# Suggestions do not count down from a huge size.
timeout 10 "$ndmesh" plan memory --model llama3-8b --global-batch 8 --tp 1099511627776 >"$tmp/out" 2>&1
[ $? -eq 2 ] || fail "plan memory --tp 2^40: exit $?"
grep -q -- "use --tp=32" "$tmp/out" || fail "no divisor suggested: $(cat "$tmp/out")"
echo ok
