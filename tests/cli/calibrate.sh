#!/usr/bin/env bash
# ndmesh calibrate: a hardware file written on 2 ranks under mpirun is read back by
# `ndmesh plan --hardware FILE`, and bad files are errors naming the key.
# Usage: bash tests/cli/calibrate.sh path/to/ndmesh
set -uo pipefail
export NDMESH_TIMEOUT_S=${NDMESH_TIMEOUT_S:-60}
ndmesh=$1
mpirun=(mpirun --allow-run-as-root --oversubscribe)
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

# Write on 2 ranks with a short budget.
out=$("${mpirun[@]}" -np 2 "$ndmesh" calibrate --seconds 1 --threads 1 --gemm-size 128 --bytes 65536 \
  --output "$dir/host.toml" --name test-host 2>&1) || fail "calibrate exit $?: $out"
[ -s "$dir/host.toml" ] || { echo "FAIL: no file written: $out"; exit 1; }
for key in '^\[hardware\]' '^name = "test-host"' '^memory_gib = ' '^peak_tflops = ' '^intra_node_gbps = ' \
  '^inter_node_gbps = ' '^gpus_per_node = 2$' '^\[measured\]' '^ranks = 2$' '^intra_allreduce_gbps = ' \
  '^intra_p2p_latency_us = ' '^intra_allgather_gbps = ' '^memory_gbps = ' '^intra_node_latency_us = ' \
  '^gemm_overhead_us = ' '^\[gemm\]' '^m = \[32, 32, 32, 32, 128, 128, 128, 128\]$' '^tflops = \['; do
  grep -q "$key" "$dir/host.toml" || fail "file lacks $key: $(cat "$dir/host.toml")"
done
# The GPU calibration: where there is a GPU it writes the GPU's keys; elsewhere (no GPU, or a
# build without CUDA) one line naming --device and the fix, exit 2, nothing written.
out=$("$ndmesh" calibrate --device cuda --seconds 2 --disk-mib 8 --output "$dir/gpu.toml" 2>&1)
rc=$?
if [ "$rc" -eq 0 ]; then
  for key in '^bf16_tflops = ' '^attention_tflops = ' '^host_to_device_gbps = ' '^device_to_host_gbps = ' '^memory_gbps = ' '^\[gemm\]'; do
    grep -q "$key" "$dir/gpu.toml" || fail "calibrate --device cuda: the file lacks $key: $(cat "$dir/gpu.toml")"
  done
else
  [ "$rc" -eq 2 ] || fail "calibrate --device cuda without a GPU: exit $rc, want 2: $out"
  [ "$(echo "$out" | wc -l)" -eq 1 ] || fail "calibrate --device cuda without a GPU: not one line: $out"
  grep -qE -- '^ndmesh: \[calibrate\] --device cuda: .*(no usable CUDA GPU|built without CUDA|sees no GPU)' <<<"$out" ||
    fail "calibrate --device cuda without a GPU: $out"
  grep -q -- "--device cpu" <<<"$out" || fail "calibrate --device cuda without a GPU: no fix named: $out"
  grep -qi "issue" <<<"$out" && fail "calibrate --device cuda: an issue number in a user's message: $out"
  [ ! -e "$dir/gpu.toml" ] || fail "calibrate --device cuda wrote a file"
fi
# Its shape flags: a bad value is one line naming the flag, before any GPU is asked for.
for bad in "--tokens 4" "--hidden 100000" "--heads 7" "--seq 9000"; do
  # shellcheck disable=SC2086
  out=$("$ndmesh" calibrate --device cuda $bad --output "$dir/gpu.toml" 2>&1)
  rc=$?
  [ "$rc" -eq 2 ] && [ "$(echo "$out" | wc -l)" -eq 1 ] && grep -q -- "${bad% *} " <<<"$out" ||
    fail "calibrate --device cuda $bad: exit $rc, want 2 and one line naming ${bad% *}: $out"
done
# --help tells what --device cuda measures.
help=$("$ndmesh" calibrate --help 2>&1)
for what in 'cuda (each rank.s GPU: fp32 and bf16 products, the fp32 flash attention and cuDNN.s bf16 attention' '--tokens' '--hidden' '--heads' '--seq'; do
  grep -q -- "$what" <<<"$help" || fail "calibrate --help lacks '$what'"
done
grep -q "not yet" <<<"$help" && fail "calibrate --help still says the GPU path is missing"

# The numbers are positive.
awk -F' = ' '/^(peak_tflops|intra_node_gbps|memory_gib|memory_gbps) = / && !($2 > 0) {print; bad=1} END {exit bad}' \
  "$dir/host.toml" || fail "non-positive measurement: $(cat "$dir/host.toml")"

# Read back: plan and plan memory accept the file; the header names the hardware. (Here-strings,
# not echo | grep -q: under pipefail grep's early exit would fail the echo of a long output.)
out=$("$ndmesh" plan --layers 2 --hidden 64 --heads 4 --kv-heads 2 --vocab 32 --seq 64 --mlp gelu --no-dropout \
  --precision fp32 --gpus 2 --global-batch 16 --hardware "$dir/host.toml" --top 3 2>&1) || fail "plan exit $?: $out"
grep -q "x test-host" <<<"$out" || fail "plan header lacks the hardware name: $out"
grep -q "2 GPUs/node" <<<"$out" || fail "plan header lacks gpus_per_node 2: $out"
out=$("$ndmesh" plan memory --layers 2 --hidden 64 --heads 4 --vocab 32 --seq 64 --dp 2 --micro-batch 8 \
  --hardware "$dir/host.toml" --json 2>&1) || fail "plan memory exit $?: $out"
grep -q '"hardware": "test-host"' <<<"$out" || fail "plan memory: hardware: $out"

# A hand-written file: the exact numbers come back (1 TFLOP/s, 10 GB/s): one GPU's step of
# a 2-layer model is its model FLOPs / 1e12.
cat >"$dir/hand.toml" <<'TOML'
[hardware]
name = "hand"
memory_gib = 16
peak_tflops = 1
intra_node_gbps = 10
gpus_per_node = 4
TOML
out=$("$ndmesh" plan memory --model gpt3-1.7b --seq 2048 --hardware "$dir/hand.toml" --attention standard \
  --json 2>&1) || fail "hand file exit $?: $out"
# 72 B s l h^2 (1 + s/(6h) + V/(12 l h)), B = 1, s = 2048, l = 24, h = 2304, V = 51200:
# 2.1760e13 FLOPs at 1e12 FLOP/s = 21.76 s.
t=$(echo "$out" | sed -n 's/.*"step_time_s": \([0-9.e+-]*\).*/\1/p')
awk -v t="$t" 'BEGIN { b=1; s=2048; l=24; h=2304; v=51200;
  f = 72*b*s*l*h*h*(1 + s/(6*h) + v/(12*l*h)); exit !(t > 0.999999*f/1e12 && t < 1.000001*f/1e12) }' ||
  fail "hand file: step_time_s $t is not the model FLOPs / 1e12"
# A GPU's file: peak_tflops is its fp32 rate, bf16_tflops its bf16 one; --precision bf16 (and
# mixed) plans run the products at 2 TFLOP/s, fp32 plans at 1.
printf 'bf16_tflops = 2\nhost_to_device_gbps = 50\ndevice_to_host_gbps = 50\n' >> "$dir/hand.toml"
for precision in fp32 bf16 mixed; do
  out=$("$ndmesh" plan memory --model gpt3-1.7b --seq 2048 --hardware "$dir/hand.toml" --attention standard \
    --precision $precision --json 2>&1) || fail "hand file, --precision $precision: exit $?: $out"
  t=$(echo "$out" | sed -n 's/.*"step_time_s": \([0-9.e+-]*\).*/\1/p')
  rate=$([ $precision = fp32 ] && echo 1e12 || echo 2e12)
  awk -v t="$t" -v r="$rate" 'BEGIN { b=1; s=2048; l=24; h=2304; v=51200;
    f = 72*b*s*l*h*h*(1 + s/(6*h) + v/(12*l*h)); exit !(t > 0.999999*f/r && t < 1.000001*f/r) }' ||
    fail "hand file with bf16_tflops, --precision $precision: step_time_s $t is not the model FLOPs / $rate"
done

# Bad files: exit 2, one line naming the file and the key.
bad() {  # bad DESCRIPTION PATTERN -- file content on stdin
  local what=$1 pattern=$2
  cat >"$dir/bad.toml"
  out=$("$ndmesh" plan --model gpt3-1.7b --gpus 2 --global-batch 8 --hardware "$dir/bad.toml" 2>&1)
  rc=$?
  [ "$rc" -eq 2 ] || fail "$what: exit $rc, want 2: $out"
  grep -q -- "$pattern" <<<"$out" || fail "$what: message lacks '$pattern': $out"
  [ "$(echo "$out" | wc -l)" -eq 1 ] || fail "$what: not one line: $out"
}
printf '[hardware]\nname = "x"\npeak_tflops = 1\nintra_node_gbps = 1\ngpus_per_node = 1\n' |
  bad "missing key" "missing key 'hardware.memory_gib'"
printf '[hardware]\nmemory_gib = 8\npeak_tflop = 1\nintra_node_gbps = 1\ngpus_per_node = 1\n' |
  bad "unknown key" "unknown key 'hardware.peak_tflop'"
printf '[hardware]\nmemory_gib = "big"\npeak_tflops = 1\nintra_node_gbps = 1\ngpus_per_node = 1\n' |
  bad "wrong type" "hardware.memory_gib must be a number"
printf '[hardware]\nmemory_gib = 8\npeak_tflops = -1\nintra_node_gbps = 1\ngpus_per_node = 1\n' |
  bad "negative" "hardware.peak_tflops -1 must be positive"
printf '[hardware]\nmemory_gib = 8\npeak_tflops = 1\nintra_node_gbps = 1\ngpus_per_node = 1.5\n' |
  bad "fractional node" "hardware.gpus_per_node = 1.5"
printf 'memory_gib = 8\n' | bad "no section" "unknown section 'memory_gib'"
printf '[hardware\n' | bad "not toml" "not a TOML hardware file"
out=$("$ndmesh" plan --model gpt3-1.7b --gpus 2 --global-batch 8 --hardware "$dir/none.toml" 2>&1)
[ $? -eq 2 ] || fail "missing file: want exit 2: $out"
grep -q "none.toml: no such file" <<<"$out" || fail "missing file: message: $out"

# Bad flags.
out=$("$ndmesh" calibrate --seconds 0 --output "$dir/x.toml" 2>&1)
[ $? -eq 2 ] || fail "--seconds 0: want exit 2: $out"
grep -q -- "--seconds 0" <<<"$out" || fail "--seconds 0: message: $out"

[ "$failures" -eq 0 ] && echo "calibrate.sh: all passed"
exit $((failures > 0))
