#!/usr/bin/env bash
# bench_gpu_model --measured: a GPU's `ndmesh train --kernel-times --json` line (the GPU check's
# profile step) against the emulator's modelled step, per kernel class. A made-up measurement of
# gpt-tiny's step (two steps timed): each class's measured time a step must be its rows' seconds
# over the steps, each row in the class its name says (products, LayerNorm, cuDNN's attention),
# and the host waits a step half of the two counted.
set -euo pipefail
bench=${1:?usage: gpu_model_measured.sh path/to/bench_gpu_model}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
{
  echo 'step 1 ...'
  echo '{"device":"cuda","precision":"bf16","kernel_times":{"steps":2,"seconds":0.01,"host_waits":2,"host_wait_seconds":0.0,"rows":[
{"name":"layernorm_backward","calls":10,"seconds":0.004},
{"name":"residual_layernorm_forward (into bf16)","calls":6,"seconds":0.002},
{"name":"gemm bf16>fp32 1024x128x384 NN","calls":6,"seconds":0.003},
{"name":"attention_forward_cudnn (batch=4 seq=256 heads=4 kv_heads=4 head_dim=32)","calls":4,"seconds":0.001}]}}' |
    tr -d '\n'
  echo
} > "$tmp/kernel-times.out"
"$bench" --model gpt-tiny --batch 4 --hardware h100 --measured "$tmp/kernel-times.out" > "$tmp/out" 2> "$tmp/err" ||
  fail "bench_gpu_model --measured: exit $?: $(cat "$tmp/err")"
cat "$tmp/out"
# The measured column of a class's row in the measured-against-modelled table.
row() {
  sed -n '/^measured/,$p' "$tmp/out" |
    awk -v c="$1" '$0 ~ "^  " c " " {for (i = 1; i <= NF; ++i) if ($i ~ /^[0-9.]+$/) {print $i; exit}}'
}
[ "$(row layernorm)" = 3.000 ] || fail "layernorm measured $(row layernorm) ms a step, expected 3.000 ((4 + 2) ms / 2 steps)"
[ "$(row 'matmul \(blocks\)')" = 1.500 ] || fail "matmul (blocks) measured $(row 'matmul \(blocks\)'), expected 1.500"
[ "$(row attention)" = 0.500 ] || fail "attention measured $(row attention), expected 0.500"
grep -q 'host waits a step: measured 1.0, modelled 1' "$tmp/out" || fail "no 'host waits a step: measured 1.0, modelled 1' line"
# A file without kernel_times is one line naming the fix, exit 2.
echo '{"device":"cuda"}' > "$tmp/no-times.out"
set +e
"$bench" --model gpt-tiny --batch 4 --hardware h100 --measured "$tmp/no-times.out" > /dev/null 2> "$tmp/err2"
rc=$?
set -e
[ $rc -eq 2 ] && grep -q 'run ndmesh train with --kernel-times' "$tmp/err2" ||
  fail "a JSON without kernel_times: exit $rc, '$(cat "$tmp/err2")'"
echo "PASS"
