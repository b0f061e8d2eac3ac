#!/usr/bin/env bash
# Bad-input sweep: every subcommand (mesh, check, launch, plan, plan memory, schedule, env;
# not train) against a table of hostile values. Each run must end within its time limit
# with exit status 2 and a single line on stderr that names the flag or field; never
# "internal error", never a signal, never a hang.
set -uo pipefail
ndmesh=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
runs=0

long=$(head -c 100000 /dev/zero | tr '\0' 'x')
printf '[parallel]\ntp = 2\n' >"$tmp/ok.toml"
mkdir "$tmp/dir.toml"

# expect <the flag or field the message must name> <args...>; the message may name the
# offending value ($value, set by the caller) instead.
value=""
expect() {
  local name=$1
  shift
  runs=$((runs + 1))
  timeout 30 "$ndmesh" "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
  local rc=$?
  local lines
  lines=$(wc -l <"$tmp/err")
  local shown="${*:0:6}"
  shown=${shown:0:200}
  if [ $rc -ne 2 ]; then
    echo "FAIL (exit $rc, want 2): ndmesh $shown"
    head -c 400 "$tmp/err"
    failures=$((failures + 1))
  elif [ "$lines" -ne 1 ]; then
    echo "FAIL ($lines lines on stderr, want 1): ndmesh $shown"
    head -c 400 "$tmp/err"
    failures=$((failures + 1))
  elif grep -q 'internal error' "$tmp/err"; then
    echo "FAIL (internal error): ndmesh $shown"
    failures=$((failures + 1))
  elif ! grep -qF -- "${name#--}" "$tmp/err" && ! grep -qF -- "${value:0:40}" "$tmp/err"; then
    echo "FAIL (message does not name '$name'): ndmesh $shown"
    head -c 400 "$tmp/err"
    failures=$((failures + 1))
  elif [ "$(wc -c <"$tmp/err")" -gt 2000 ]; then
    echo "FAIL (message of $(wc -c <"$tmp/err") bytes; long values must be cut): ndmesh $shown"
    failures=$((failures + 1))
  fi
}

# Integer flags of each subcommand, with the hostile values every one must refuse. (An
# empty value is not among them: CLI11 reads --flag "" as the flag's default.)
ints=(-2 -9223372036854775808 9223372036854775808 NaN 1e3 "٣" "$long")
for v in "${ints[@]}"; do
  value=$v
  # CLI11 reads 9223372036854775808 as 2^63-1; 2^63-1 ranks per node is a valid answer
  # ("1 node"), so --ranks-per-node is left out for that value.
  for flag in --dp --tp --pp --cp --ep --world --ranks-per-node --rank --max-groups; do
    [[ "$v" == 9223372036854775808 && "$flag" == --ranks-per-node ]] && continue
    expect "$flag" mesh "$flag" "$v"
  done
  for flag in --dp --tp --world --ranks-per-node; do
    [[ "$v" == 9223372036854775808 && "$flag" == --ranks-per-node ]] && continue
    expect "$flag" check "$flag" "$v"
  done
  expect "-n" launch --np "$v" -- true
  for flag in --gpus --top --global-batch --seq --layers --hidden --heads --vocab --ep; do
    # A model of 2^63 layers is not bad input: the planner answers that nothing fits (exit 1).
    [[ "$v" == 9223372036854775808 && "$flag" =~ ^--(seq|layers|vocab)$ ]] && continue
    expect "$flag" plan --model llama3-8b --gpus 8 --global-batch 8 "$flag" "$v"
  done
  for flag in --tp --cp --pp --dp --ep --vpp --micro-batch --zero; do
    expect "$flag" plan memory --model llama3-8b --global-batch 8 "$flag" "$v"
  done
  for flag in --pp --microbatches --vpp; do
    expect "$flag" schedule "$flag" "$v"
  done
done
# Zero where at least 1 is needed.
for flag in --dp --tp --world --ranks-per-node --max-groups; do expect "$flag" mesh "$flag" 0; done
expect "--gpus" plan --model llama3-8b --gpus 0 --global-batch 8
expect "--top" plan --model llama3-8b --gpus 8 --global-batch 8 --top 0
expect "--pp" schedule --pp 0
expect "microbatches" schedule --microbatches 0
# Huge values refused with the limit, not computed for minutes.
expect "--gpus" plan --model llama3-8b --gpus 9223372036854775807 --global-batch 8
expect "--gpus" plan --model llama3-8b --gpus 16777216 --global-batch 8
expect "--top" plan --model llama3-8b --gpus 8 --global-batch 8 --top 1000000000
expect "tp" plan memory --model llama3-8b --global-batch 8 --tp 1099511627776
expect "--json" mesh --dp 2147483648 --json
expect "--json" mesh --dp 67108864 --rank 5 --json
expect "pp" schedule --pp 100000 -m 100000
# Costs: negative, NaN, infinite.
for v in -1 NaN inf -inf "$long"; do
  value=$v
  for flag in --cost-forward --cost-backward-input --cost-backward-weight --cost-p2p; do
    expect "${flag#--}" schedule "$flag" "$v"
  done
done
# Names: unknown, empty, unicode, very long.
for v in "pipeline" "dp,,tp" "ðp,tp" "$long"; do
  value=$v
  expect "--order" mesh --order "$v" --dp 2
  expect "dim" mesh --dp 2 --groups "$v"
done
value="dp,dp"
expect "--order" mesh --order "dp,dp" --dp 2
for v in "a" "a=" "=2" "a=2,a=2" "a=-2" "a=2,b=x" "ä=2" "$long"; do
  value=$v
  expect "dim" mesh --dims "$v"
done
for v in "" "fast" "1f1b " "$long"; do value=$v; expect "--schedule" schedule --schedule "$v"; done
for v in "h1000" "$long"; do value=$v; expect "--hardware" plan --model llama3-8b --gpus 8 --global-batch 8 --hardware "$v"; done
for v in "gpt5" "$long"; do value=$v; expect "--model" plan --model "$v" --gpus 8 --global-batch 8; done
value=""
expect "--color" schedule --color rainbow
expect "heavy" mesh --dp 2 --heavy-dims xp
# Files: missing, a directory, a device, unparsable, typos.
for sub in mesh check; do
  expect "--config" $sub --config "$tmp/missing.toml"
  expect "dir.toml" $sub --config "$tmp/dir.toml"
  expect "/dev/null" $sub --config /dev/null
done
printf 'not = toml = at all\n' >"$tmp/bad.toml"
expect "bad.toml" mesh --config "$tmp/bad.toml"
printf '[parallel]\nheavy_dims = ["tpp"]\n' >"$tmp/heavy.toml"
expect "heavy_dims" mesh --config "$tmp/heavy.toml"
printf '[parallel]\ntp = 99999999999999999999\n' >"$tmp/overflow.toml"
expect "overflow.toml" mesh --config "$tmp/overflow.toml"
printf '[model]\nvocab = 1\nlayers = 2\nhidden = 8\nheads = 2\nseq = 8\n' >"$tmp/vocab.toml"
expect "vocab" mesh --config "$tmp/vocab.toml"
expect "--svg" schedule --svg "$tmp/dir.toml"
expect "--svg" schedule --svg "$tmp/missing/dir/x.svg"
# Unknown commands and flags.
expect "meshx" meshx
expect "--bogus" mesh --bogus
# Environment variables, refused by every command at start-up.
for v in verbose "" ; do
  [ -n "$v" ] || continue
  runs=$((runs + 1))
  NDMESH_LOG=$v expect "NDMESH_LOG" mesh
done
NDMESH_TIMEOUT_S=5m expect "NDMESH_TIMEOUT_S" mesh
NDMESH_TIMEOUT_S=-1 expect "NDMESH_TIMEOUT_S" env
NDMESH_THREADS=many expect "NDMESH_THREADS" schedule
NDMESH_BACKEND=ucc expect "NDMESH_BACKEND" check
NDMESH_ATTENTION=cudnn9 expect "NDMESH_ATTENTION" mesh

echo "$runs runs, $failures failures"
[ "$failures" -eq 0 ]
