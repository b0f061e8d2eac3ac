#!/usr/bin/env bash
# `ndmesh mesh`: seed 004's groups verbatim, JSON shapes, --rank, and bad input -> exit 2
# with a message naming the field. Expected values are written out by hand.
set -uo pipefail
ndmesh=${1:?usage: mesh.sh path/to/ndmesh}
failures=0
passes=0
pass() { echo "ok   $1"; passes=$((passes + 1)); }
failed() { echo "FAIL $1"; failures=$((failures + 1)); }
check() {  # check NAME EXPECTED ACTUAL
  if [ "$2" == "$3" ]; then pass "$1"; else failed "$1: expected [$2] got [$3]"; fi
}

# Seed 004: dims outer to inner pipe=2,tensor=2,data=4; its printed groups, by color.
out=$("$ndmesh" mesh --dims pipe=2,tensor=2,data=4 --groups pipe,tensor,data,pipe-tensor --json)
check "seed004 pipe" '[[0,8],[1,9],[2,10],[3,11],[4,12],[5,13],[6,14],[7,15]]' "$(jq -c '.groups.pipe' <<<"$out")"
check "seed004 tensor" '[[0,4],[1,5],[2,6],[3,7],[8,12],[9,13],[10,14],[11,15]]' "$(jq -c '.groups.tensor' <<<"$out")"
check "seed004 data" '[[0,1,2,3],[4,5,6,7],[8,9,10,11],[12,13,14,15]]' "$(jq -c '.groups.data' <<<"$out")"
check "seed004 model" '[[0,4,8,12],[1,5,9,13],[2,6,10,14],[3,7,11,15]]' "$(jq -c '.groups["pipe-tensor"]' <<<"$out")"
check "dims outer to inner" '[{"name":"pipe","size":2},{"name":"tensor","size":2},{"name":"data","size":4}]' \
  "$(jq -c '.dims' <<<"$out")"
check "world_size" 16 "$(jq '.world_size' <<<"$out")"

# Group keys are named in mesh order whatever order --groups uses.
out=$("$ndmesh" mesh --dp 2 --pp 2 --cp 2 --tp 2 --groups cp-dp,tp --json)
check "key in mesh order" '["dp-cp","tp"]' "$(jq -c '.groups | keys' <<<"$out")"
check "dp-cp groups" '[[0,2,8,10],[1,3,9,11],[4,6,12,14],[5,7,13,15]]' "$(jq -c '.groups["dp-cp"]' <<<"$out")"

# Both spellings of one layout give the same groups.
a=$("$ndmesh" mesh --tp 2 --cp 2 --dp 2 --pp 2 --order pp,dp,cp,tp --json)
b=$("$ndmesh" mesh --tp 2 --cp 2 --dp 2 --pp 2 --megatron-order tp-cp-dp-pp --json)
check "order == megatron-order" "$a" "$b"

# One size inferred from --world.
check "dp=-1 inferred" 4 "$("$ndmesh" mesh --tp 2 --pp 2 --dp -1 --world 16 --json | jq '.dims[0].size')"

# --rank: coordinates, node, groups, neighbours.
out=$("$ndmesh" mesh --dp 2 --pp 2 --cp 1 --tp 2 --ranks-per-node 4 --rank 5 --json)
check "rank coords" '{"dp":1,"pp":0,"cp":0,"tp":1}' "$(jq -c '.coords' <<<"$out")"
check "rank node" '1 1' "$(jq -r '"\(.node) \(.local_rank)"' <<<"$out")"
check "rank tp group" '[4,5]' "$(jq -c '.groups.tp' <<<"$out")"
check "rank pp next" '7' "$(jq -c '.neighbours.pp.next' <<<"$out")"
check "rank pp prev" 'null' "$(jq -c '.neighbours.pp.prev' <<<"$out")"
check "rank tp ring next" '4' "$(jq -c '.neighbours.tp.ring_next' <<<"$out")"

# A million ranks: --rank answers without enumerating the world.
out=$(timeout 5 "$ndmesh" mesh --tp 8 --cp 4 --pp 16 --dp 2048 --rank 1048575 --groups dp --json)
check "million-rank dp group size" 2048 "$(jq '.groups.dp | length' <<<"$out")"
check "million-rank coords" '{"dp":2047,"pp":15,"cp":3,"tp":7}' "$(jq -c '.coords' <<<"$out")"

# Placement: tp outermost on 8-rank nodes crosses nodes and is warned about.
out=$("$ndmesh" mesh --dp 2 --pp 2 --cp 2 --tp 2 --order tp,dp,pp,cp --ranks-per-node 8)
if grep -q "warning: tp groups cross node boundaries" <<<"$out"; then pass "tp crossing warned"; else failed "no tp crossing warning"; fi
out=$("$ndmesh" mesh --dp 2 --pp 2 --cp 2 --tp 2 --ranks-per-node 8)
if grep -q "warning" <<<"$out"; then failed "default order warned"; else pass "default order quiet"; fi

# Config file, overridden by flags.
cfg=$(mktemp --suffix=.toml)
printf '[parallel]\ntp = 2\npp = 2\ndp = 2\nranks_per_node = 4\n' >"$cfg"
check "config file" '[2,2,1,2]' "$("$ndmesh" mesh --config "$cfg" --json | jq -c '[.dims[].size]')"
check "flag overrides file" '[2,2,1,4]' "$("$ndmesh" mesh --config "$cfg" --tp 4 --json | jq -c '[.dims[].size]')"

# Bad input: exit 2, one line naming the field and value.
bad() {  # bad NAME FRAGMENT ARGS...
  local name=$1 fragment=$2
  shift 2
  local err code
  err=$("$ndmesh" mesh "$@" 2>&1 >/dev/null)
  code=$?
  if [ "$code" -eq 2 ] && grep -qF -- "$fragment" <<<"$err"; then
    pass "$name"
  else
    failed "$name: exit $code, stderr [$err]"
  fi
}
bad "world mismatch" "world has 8 ranks" --tp 3 --world 8
bad "unknown dim in order" "'xx'" --tp 2 --order dp,pp,xx,tp
bad "duplicate dim" "twice" --order dp,tp,tp
bad "not a number" "--tp" --tp x
bad "unknown group dim" "'zz'" --groups tp-zz
bad "rank out of range" "rank 9" --tp 2 --rank 9
bad "dims with size flag" "--dims" --dims a=2 --tp 2
bad "missing config" "/nope.toml" --config /nope.toml
bad "zero size" "tp=0" --tp 0
bad "infer without world" "dp=-1" --dp -1
printf '[parallel]\ntpp = 2\n' >"$cfg"
bad "unknown config key" "parallel.tpp" --config "$cfg"
printf '[parallel]\ntp = 2\n[model]\nlayers = 3\nhidden = 64\nheads = 4\nseq = 16\nvocab = 10\n' >"$cfg"
bad "model-aware check" "heads=4" --config "$cfg" --tp 8 2>/dev/null
rm -f "$cfg"

echo "$passes passed, $failures failed"
[ "$failures" -eq 0 ]
