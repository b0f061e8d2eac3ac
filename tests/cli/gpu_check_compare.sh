#!/usr/bin/env bash
# scripts/gpu_check_compare.py, the GPU check's comparisons, on real ndmesh outputs of this
# machine (train --json, its step lines, a checkpoint resumed, plan memory --json) and on
# made-up GPU results: each gives its PASS line on agreeing inputs and its FAIL line on
# disagreeing or broken ones, never a traceback. These paths run only on a GPU in the check
# itself, so their bugs are found here.
# Usage: bash tests/cli/gpu_check_compare.sh <ndmesh>
set -uo pipefail
ndmesh=${1:?usage: gpu_check_compare.sh <ndmesh>}
root=$(cd "$(dirname "$0")/../.." && pwd)
compare=$root/scripts/gpu_check_compare.py
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-compare.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
errors=0

# expect <PASS|FAIL> <pattern> <comparison> <args>...: the one line and the exit status.
expect() {
  local want=$1 pattern=$2 got rc
  shift 2
  got=$(python3 "$compare" "$@" 2>&1)
  rc=$?
  if [[ $got != "$want "* ]] || [[ $got != *$pattern* ]] || [ "$(wc -l <<< "$got")" -ne 1 ] ||
    { [ "$want" = PASS ] && [ $rc -ne 0 ]; } || { [ "$want" = FAIL ] && [ $rc -ne 1 ]; }; then
    echo "FAIL: gpu_check_compare.py $* gave (exit $rc) '$got'; expected $want ... '$pattern'" >&2
    errors=$((errors + 1))
  fi
}

model=(train --layers 1 --hidden 32 --heads 2 --seq 16 --vocab 64 --markov-vocab 64 --batch 2 --seed 3
  --eval-batches 0 --threads 1 --json --device cpu)
"$ndmesh" "${model[@]}" --steps 36 > "$tmp/full.out" || exit 1
"$ndmesh" "${model[@]}" --steps 36 --until 10 --save "$tmp/ckpt" > /dev/null || exit 1
"$ndmesh" "${model[@]}" --steps 36 --load "$tmp/ckpt" > "$tmp/resumed.out" || exit 1
"$ndmesh" plan memory --layers 12 --hidden 768 --heads 12 --seq 1024 --vocab 1024 --micro-batch 8 --precision fp32 \
  --no-dropout --attention flash --mlp gelu --json > "$tmp/plan.json" || exit 1

# equal: the same run twice agrees; a loss off by 1e-4 relative, or a step missing, does not.
expect PASS 'losses 0 (bound 1e-5)' equal "$tmp/full.out" "$tmp/full.out"
python3 - "$tmp/full.out" "$tmp/off.json" "$tmp/short.json" << 'EOF'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
r["losses"][7] *= 1 + 1e-4
json.dump(r, open(sys.argv[2], "w"))
r["losses"], r["grad_norms"] = r["losses"][:-1], r["grad_norms"][:-1]
json.dump(r, open(sys.argv[3], "w"))
EOF
expect FAIL 'losses 0.0001 (bound 1e-5)' equal "$tmp/full.out" "$tmp/off.json"
expect FAIL 'different numbers of steps' equal "$tmp/full.out" "$tmp/short.json"
expect FAIL 'equal: ' equal "$tmp/full.out" "$tmp/missing.json"
echo 'not json' > "$tmp/broken.json"
expect FAIL 'equal: ValueError' equal "$tmp/full.out" "$tmp/broken.json"

# resumed: steps 11-36 of a run resumed at step 10 against the uninterrupted one.
expect PASS 'losses of steps 11-36 within 0 of' resumed "$tmp/full.out" "$tmp/resumed.out"
expect FAIL 'the resumed run has 36 steps' resumed "$tmp/full.out" "$tmp/full.out"

# offload: a made-up --offload optimizer run on cuda (the pinned fields) against the run
# without: bit for bit, 1e-7 off (within the bounds, not bit for bit), and no pinned fields.
python3 - "$tmp/full.out" "$tmp/pinned.json" "$tmp/pinned-off.json" << 'EOF'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
r["offload"] = "optimizer"
r["memory_bytes"]["optimizer_host"] = 3 << 20
r["offload_pcie"] = {"bytes_to_host_per_step": 1 << 20, "bytes_to_device_per_step": 1 << 20}
json.dump(r, open(sys.argv[2], "w"))
r["losses"][5] *= 1 + 1e-7
json.dump(r, open(sys.argv[3], "w"))
EOF
expect PASS 'without offload: bit for bit;' offload "$tmp/full.out" "$tmp/pinned.json"
expect PASS 'pinned host 3.00 MiB, PCIe 2.00 MiB per step' offload "$tmp/full.out" "$tmp/pinned.json"
expect PASS 'not bit for bit' offload "$tmp/full.out" "$tmp/pinned-off.json"
expect FAIL 'reports no pinned offload' offload "$tmp/full.out" "$tmp/full.out"

# bf16: pairs of (fp32, bf16) runs; losses within 1% at every step, the step-1 gradient norm
# within 2%; a second pair 1.5% off at one step fails the whole comparison.
python3 - "$tmp/full.out" "$tmp/bf16-off.json" "$tmp/bf16-norm-off.json" << 'EOF'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
r["losses"][20] *= 1.015
json.dump(r, open(sys.argv[2], "w"))
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
r["grad_norms"][0] *= 1.03
json.dump(r, open(sys.argv[3], "w"))
EOF
expect PASS 'losses within 0.00% (bound 1%)' bf16 "$tmp/full.out" "$tmp/full.out" "$tmp/full.out" "$tmp/full.out"
expect FAIL 'losses within 1.50% (bound 1%)' bf16 "$tmp/full.out" "$tmp/full.out" "$tmp/full.out" "$tmp/bf16-off.json"
expect FAIL 'step-1 gradient norm 3.00% (2%)' bf16 "$tmp/full.out" "$tmp/bf16-norm-off.json" "$tmp/full.out" "$tmp/full.out"

# bf16-devices: cuda bf16 against cpu bf16 over the cpu run's steps (10 of the full run's 36
# here); a step-1 gradient norm 1e-4 off (what fp32 against bf16 gives) fails, and so does a
# cuda run shorter than the cpu run.
python3 - "$tmp/full.out" "$tmp/cpu10.json" "$tmp/norm1e-4.json" << 'EOF'
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
json.dump(dict(r, losses=r["losses"][:10], grad_norms=r["grad_norms"][:10]), open(sys.argv[2], "w"))
r["grad_norms"][0] *= 1 + 1e-4
json.dump(r, open(sys.argv[3], "w"))
EOF
expect PASS 'over 10 steps: losses 0 (bound 2e-4), step-1 gradient norm 0 (5e-5)' bf16-devices "$tmp/cpu10.json" "$tmp/full.out"
expect FAIL 'step-1 gradient norm 0.0001 (5e-5)' bf16-devices "$tmp/cpu10.json" "$tmp/norm1e-4.json"
expect FAIL '10 of 36 steps' bf16-devices "$tmp/full.out" "$tmp/cpu10.json"

# speed: steps 6-36 of the step lines (31 timed), and too few steps.
expect PASS 'over steps 6-36' speed "$tmp/full.out" 5 32 "$tmp/speed.json"
python3 -c 'import json, sys; s = json.load(open(sys.argv[1])); assert s["timed_steps"] == 31 and s["tokens_per_second"] > 0' \
  "$tmp/speed.json" || { echo "FAIL: speed.json: $(cat "$tmp/speed.json")" >&2; errors=$((errors + 1)); }
head -n 20 "$tmp/full.out" > "$tmp/few.out"
expect FAIL 'need steps 5 to 35' speed "$tmp/few.out" 5 32 "$tmp/unused.json"

# memory: a device peak 5% over the plan passes, 20% over fails.
planned=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["memory_bytes"]["total"])' "$tmp/plan.json")
echo "{\"memory_bytes\": {\"device_peak\": $(python3 -c "print(1.05 * $planned)")}}" > "$tmp/near.json"
echo "{\"memory_bytes\": {\"device_peak\": $(python3 -c "print(1.2 * $planned)")}}" > "$tmp/far.json"
expect PASS 'measured/planned 1.050' memory "$tmp/near.json" "$tmp/plan.json"
expect FAIL 'measured/planned 1.200' memory "$tmp/far.json" "$tmp/plan.json"

# torch: the baseline's line and the ratio of ndmesh's tokens/s to it.
tps=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["tokens_per_second"])' "$tmp/speed.json")
echo "{\"tokens_per_second\": $(python3 -c "print(2 * $tps)"), \"timed_steps\": 30, \"warmup_steps\": 5," \
  "\"device_peak\": 1073741824, \"gpu\": \"NVIDIA H100\", \"torch\": \"2.11.0\", \"cuda\": \"13.0\"}" > "$tmp/torch.json"
expect PASS 'ndmesh/PyTorch tokens/s 0.500' torch "$tmp/torch.json" "$tmp/speed.json"
expect PASS 'no ndmesh tokens/s to compare' torch "$tmp/torch.json" "$tmp/missing.json"
expect FAIL 'usage' nonsense

# calibration: a GPU's hardware file gives its rates; a CPU's (no bf16_tflops) or a rate of 0 fails.
gpu_file() {  # gpu_file <bf16_tflops> > file
  printf '[hardware]\nname = "gpu"\nmemory_gib = 79.2\nreserved_gib = 0.5\npeak_tflops = 51\nbf16_tflops = %s\n' "$1"
  printf 'attention_tflops = 12.5\n'
  printf 'intra_node_gbps = 1000\ngpus_per_node = 1\nmemory_gbps = 2900\ngemm_overhead_us = 4\n'
  printf 'host_to_device_gbps = 53\ndevice_to_host_gbps = 49 # a comment\n\n[measured]\nranks = 1\n'
}
gpu_file 640 > "$tmp/gpu.toml"
gpu_file 0 > "$tmp/gpu0.toml"
grep -v -e bf16 -e _to_ -e attention "$tmp/gpu.toml" > "$tmp/cpu.toml"
expect PASS 'fp32 products 51.0 TFLOP/s, bf16 640.0 TFLOP/s, 4.00 us per product; fp32 attention 12.5 TFLOP/s, bf16 attention (cuDNN) not measured; device copies 2900 GB/s; pinned host to device 53.0 GB/s, device to host 49.0 GB/s' \
  calibration "$tmp/gpu.toml"
{ cat "$tmp/gpu.toml"; } | sed 's/^attention_tflops = 12.5$/attention_tflops = 12.5\nbf16_attention_tflops = 210/' > "$tmp/gpu_cudnn.toml"
expect PASS 'fp32 attention 12.5 TFLOP/s, bf16 attention (cuDNN) 210.0 TFLOP/s; device copies' calibration "$tmp/gpu_cudnn.toml"
expect FAIL 'not positive: bf16_tflops' calibration "$tmp/gpu0.toml"
expect FAIL 'lacks hardware.bf16_tflops, hardware.attention_tflops, hardware.host_to_device_gbps' calibration "$tmp/cpu.toml"
expect FAIL 'calibration: ' calibration "$tmp/missing.toml"

# plan: ndmesh plan memory on that file against a measured step 20% longer (passes) or 50%
# longer (fails), and a device peak 20% over the plan (fails).
"$ndmesh" plan memory --layers 12 --hidden 768 --heads 12 --seq 1024 --vocab 1024 --micro-batch 8 --precision fp32 \
  --no-dropout --attention flash --mlp gelu --hardware "$tmp/gpu.toml" --json > "$tmp/plan-gpu.json" || exit 1
step=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["step_time_s"])' "$tmp/plan-gpu.json")
echo "{\"step_seconds\": $(python3 -c "print(1.2 * $step)")}" > "$tmp/speed-near.json"
echo "{\"step_seconds\": $(python3 -c "print(1.5 * $step)")}" > "$tmp/speed-far.json"
expect PASS 'predicted/measured 0.833 (bound: within 25%); device memory' plan "$tmp/plan-gpu.json" "$tmp/speed-near.json" \
  "$tmp/near.json"
expect FAIL 'predicted/measured 0.667' plan "$tmp/plan-gpu.json" "$tmp/speed-far.json" "$tmp/near.json"
expect FAIL 'measured/predicted 1.200' plan "$tmp/plan-gpu.json" "$tmp/speed-near.json" "$tmp/far.json"
expect FAIL 'plan: ' plan "$tmp/plan-gpu.json" "$tmp/missing.json" "$tmp/near.json"

[ $errors -eq 0 ] || exit 1
echo "PASS: every comparison gives its one line"
