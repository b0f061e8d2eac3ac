#!/usr/bin/env bash
# `ndmesh plan`: the search prints a ranked table and JSON, `plan memory` reproduces hand
# computations, and bad input exits 2 naming the flag and the value.
# Usage: bash tests/cli/plan.sh path/to/ndmesh
set -u
ndmesh=$1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
expect_rc() {  # expect_rc CODE DESCRIPTION -- command...
  local want=$1 what=$2; shift 3
  out=$("$@" 2>&1); rc=$?
  [ "$rc" -eq "$want" ] || fail "$what: exit $rc, want $want; output: $out"
}

# The search of the issue's example: a table of --top rows, best first.
expect_rc 0 "search" -- "$ndmesh" plan --model llama3-70b --gpus 512 --hardware h100 --seq 8192 \
  --global-batch 1024 --top 5
rows=$(echo "$out" | grep -cE '^ +[1-5] +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ ')
[ "$rows" -eq 5 ] || fail "search: want 5 ranked rows, got $rows: $out"
echo "$out" | grep -q "70.55B parameters" || fail "search: header lacks the parameter count: $out"

# The commands that run a plan run on the plan's hardware: a GPU preset's carry --device cuda
# (and bf16 for a 16-bit plan), a CPU hardware file's run on the CPU; the JSON's train_flags
# stay the layout and the model.
expect_rc 0 "to run on a GPU preset" -- "$ndmesh" plan --model gpt3-1.7b --gpus 16 --global-batch 64 --top 1
line=$(echo "$out" | grep 'this machine:')
[[ "$line" == *"ndmesh train --tp "*" --device cuda --precision bf16" ]] || fail "GPU preset, mixed: $line"
expect_rc 0 "to run on a GPU preset in fp32" -- "$ndmesh" plan --model gpt3-1.7b --gpus 16 --global-batch 64 \
  --top 1 --precision fp32
line=$(echo "$out" | grep 'this machine:')
[[ "$line" == *" --device cuda" && "$line" != *"--precision"* ]] || fail "GPU preset, fp32: $line"
cpu_hw=$(mktemp --suffix=.toml)
printf '[hardware]\nname = "cpu"\nmemory_gib = 64\npeak_tflops = 1\nintra_node_gbps = 10\ngpus_per_node = 8\n' > "$cpu_hw"
expect_rc 0 "to run on a CPU file" -- "$ndmesh" plan --model gpt3-1.7b --gpus 16 --global-batch 64 --top 1 \
  --hardware "$cpu_hw" --precision fp32
line=$(echo "$out" | grep 'this machine:')
[ -n "$line" ] && [[ "$line" != *"--device"* ]] || fail "CPU hardware file: $line"
rm -f "$cpu_hw"

# --explain shows every term.
expect_rc 0 "explain" -- "$ndmesh" plan --model llama3-70b --gpus 512 --seq 8192 --global-batch 1024 --explain
for term in compute recompute "tensor parallel" "context parallel" "pipeline sends" bubble "data parallel" \
  activations optimizer; do
  echo "$out" | grep -q "$term" || fail "explain: no '$term' line"
done

# JSON: the field names of the issue, --top layouts.
expect_rc 0 "search json" -- "$ndmesh" plan --model gpt3-175b --gpus 64 --hardware a100-80gb \
  --global-batch 512 --top 3 --json
for key in '"layouts"' '"tp"' '"cp"' '"pp"' '"dp"' '"vpp"' '"micro_batch"' '"schedule"' '"recompute"' \
  '"zero"' '"memory_bytes"' '"params"' '"grads"' '"optimizer"' '"activations"' '"total"' '"step_time_s"' \
  '"tokens_per_second"' '"mfu"'; do
  echo "$out" | grep -q "$key" || fail "search json: no $key"
done
n=$(echo "$out" | grep -c '"step_time_s"')
[ "$n" -eq 3 ] || fail "search json: want 3 layouts, got $n"

# plan memory for GPT-3 175B, tp 8, pp 8, micro-batch 1, SP + selective recompute:
# parameters 174,615,846,912 (12*96*12288^2 + 13*12288*96 + 53248*12288 + 2*12288) and
# first-stage activations 96 layers x 34 sbh/8 + the embedding mask sbh*8/8
# = 96 * 106,954,752 + 25,165,824 = 10,292,822,016 bytes (Korthikanti et al. 2022).
expect_rc 0 "memory json" -- "$ndmesh" plan memory --model gpt3-175b --tp 8 --pp 8 --dp 1 --micro-batch 1 \
  --seq 2048 --sequence-parallel --recompute selective --attention standard --json
echo "$out" | grep -q '"parameters": 174615846912' || fail "memory json: parameters: $out"
echo "$out" | grep -q '"activations": 10292822016' || fail "memory json: activations: $out"
echo "$out" | grep -q '"step_time_s"' || fail "memory json: no step_time_s"

# The same with flash attention (the default): selective recompute drops the attention
# output 2sbh/8 = 6,291,456 and the fp32 log-sum-exp 4as/t = 4*96*2048/8 = 98,304 bytes per
# layer (32 sbh/8 = 100,663,296 kept) and holds one layer's worth of them while it recomputes:
# 96 * 100,663,296 + 25,165,824 + 6,389,760 = 9,695,232,000.
expect_rc 0 "memory flash" -- "$ndmesh" plan memory --model gpt3-175b --tp 8 --pp 8 --dp 1 --micro-batch 1 \
  --seq 2048 --sequence-parallel --recompute selective --json
echo "$out" | grep -q '"activations": 9695232000' || fail "memory flash: activations: $out"
# Without recompute flash keeps the log-sum-exp: 96 * (106,954,752 + 98,304) + 25,165,824.
expect_rc 0 "memory flash none" -- "$ndmesh" plan memory --model gpt3-175b --tp 8 --pp 8 --dp 1 --micro-batch 1 \
  --seq 2048 --sequence-parallel --recompute none --json
echo "$out" | grep -q '"activations": 10302259200' || fail "memory flash none: activations: $out"
echo "$out" | grep -q '"attention": "flash"' || fail "memory flash: attention: $out"
expect_rc 0 "explain flash" -- "$ndmesh" plan memory --model gpt3-175b --tp 8 --pp 8 --dp 1 --seq 2048
echo "$out" | grep -q "flash (Dao et al. 2022)" || fail "explain flash: formula not named: $out"
expect_rc 2 "bad attention" -- "$ndmesh" plan memory --model gpt3-175b --attention sparse
echo "$out" | grep -q -- "--attention 'sparse'" || fail "bad attention: message: $out"

# Constraints fix dims (or lists of them) and the header says so.
expect_rc 0 "constraints" -- "$ndmesh" plan --model llama3-70b --gpus 64 --seq 8192 --global-batch 256 \
  --tp 8 --pp 4 --max-zero 1 --recompute none,selective --schedules 1f1b,interleaved --top 50
echo "$out" | grep -q "constraints: tp=8 pp=4 zero<=1 schedule=1f1b,interleaved recompute=none,selective" ||
  fail "constraints: header: $out"
bad=$(echo "$out" | grep -E '^ +[0-9]+ +[0-9]+ ' | awk '$2 != 8 || $4 != 4 || $10 > 1 || $9 == "full"')
[ -z "$bad" ] || fail "constraints: rows break them: $bad"
expect_rc 0 "constraints json" -- "$ndmesh" plan --model llama3-70b --gpus 64 --seq 8192 --global-batch 256 \
  --tp 8 --pp 4 --dp 2 --cp 1 --vpp 1 --micro-batch 1 --no-sequence-parallel --json
n=$(echo "$out" | grep -c '"sequence_parallel": true')
[ "$n" -eq 0 ] || fail "constraints json: sequence parallelism despite --no-sequence-parallel"
echo "$out" | grep -q '"dp": 2' || fail "constraints json: dp: $out"
expect_rc 2 "impossible tp" -- "$ndmesh" plan --model llama3-8b --gpus 24 --global-batch 48 --tp 3
echo "$out" | grep -q -- "--tp 3.*heads=32" || fail "impossible tp: message: $out"
expect_rc 2 "impossible product" -- "$ndmesh" plan --model llama3-8b --gpus 24 --global-batch 48 --tp 8 --pp 4
echo "$out" | grep -q "tp=8 pp=4" || fail "impossible product: message: $out"
expect_rc 2 "bad list" -- "$ndmesh" plan --model llama3-8b --gpus 8 --global-batch 8 --tp 4,x
echo "$out" | grep -q -- "--tp '4,x'" || fail "bad list: message: $out"
expect_rc 2 "bad max zero" -- "$ndmesh" plan --model llama3-8b --gpus 8 --global-batch 8 --max-zero 4
echo "$out" | grep -q -- "--max-zero 4" || fail "bad max zero: message: $out"

# Uneven pipelines: 24 layers over pp 5 run as 5,5,5,5,4; --pp-layers overrides.
expect_rc 0 "uneven pp" -- "$ndmesh" plan memory --model gpt3-1.7b --pp 5 --global-batch 10 --json
echo "$out" | grep -q '"pp_layers": \[' || fail "uneven pp: no pp_layers: $out"
echo "$out" | tr -d ' \n' | grep -q '"pp_layers":\[5,5,5,5,4\]' || fail "uneven pp: partition: $out"
expect_rc 0 "explicit pp layers" -- "$ndmesh" plan memory --model gpt3-1.7b --pp 5 --global-batch 10 \
  --pp-layers 4,5,5,5,5 --json
echo "$out" | tr -d ' \n' | grep -q '"pp_layers":\[4,5,5,5,5\]' || fail "explicit pp layers: $out"
expect_rc 0 "search pp layers" -- "$ndmesh" plan --model gpt3-1.7b --gpus 5 --global-batch 10 --pp 5 \
  --pp-layers 4,5,5,5,5 --top 1 --json
echo "$out" | tr -d ' \n' | grep -q '"pp_layers":\[4,5,5,5,5\]' || fail "search pp layers: $out"
expect_rc 2 "pp layers count" -- "$ndmesh" plan memory --model gpt3-1.7b --pp 5 --pp-layers 12,12
echo "$out" | grep -q -- "--pp-layers '12,12' has 2 entries" || fail "pp layers count: message: $out"
expect_rc 2 "pp layers sum" -- "$ndmesh" plan memory --model gpt3-1.7b --pp 2 --pp-layers 12,13
echo "$out" | grep -q "adds up to 25.*layers=24" || fail "pp layers sum: message: $out"

# Nothing fits: exit 1 and say by how much.
expect_rc 1 "nothing fits" -- "$ndmesh" plan --model gpt3-1t --gpus 8 --hardware a100-80gb --global-batch 64
echo "$out" | grep -q "GiB short" || fail "nothing fits: no shortfall: $out"

# Bad input: exit 2, one line naming the flag and the value.
expect_rc 2 "unknown model" -- "$ndmesh" plan --model llama3-7b --gpus 8 --global-batch 8
echo "$out" | grep -q "'llama3-7b'.*llama3-8b" || fail "unknown model: message: $out"
expect_rc 2 "unknown hardware" -- "$ndmesh" plan --model llama3-8b --hardware tpu --gpus 8 --global-batch 8
echo "$out" | grep -q "'tpu'.*h100" || fail "unknown hardware: message: $out"
expect_rc 2 "no gpus" -- "$ndmesh" plan --model llama3-8b --global-batch 8
echo "$out" | grep -q -- "--gpus" || fail "no gpus: message: $out"
expect_rc 2 "bad recompute" -- "$ndmesh" plan memory --model llama3-8b --recompute some
echo "$out" | grep -q -- "--recompute=some is not a recompute mode" || fail "bad recompute: message: $out"
expect_rc 2 "bad zero" -- "$ndmesh" plan memory --model llama3-8b --zero 5
echo "$out" | grep -q -- "--zero 5" || fail "bad zero: message: $out"
expect_rc 2 "bad tp" -- "$ndmesh" plan memory --model llama3-8b --tp 3
echo "$out" | grep -q "tp=3" || fail "bad tp: message: $out"
expect_rc 2 "bad efficiency" -- "$ndmesh" plan --model llama3-8b --gpus 8 --global-batch 8 --efficiency 2
echo "$out" | grep -q -- "--efficiency 2" || fail "bad efficiency: message: $out"
expect_rc 2 "not a number" -- "$ndmesh" plan --model llama3-8b --gpus many --global-batch 8
# A subcommand's flag is described by that subcommand (plan memory's --tp is a number, plan's a list).
expect_rc 2 "memory tp not a number" -- "$ndmesh" plan memory --model llama3-8b --tp x
echo "$out" | grep -qF -- "--tp=x is not a whole number; e.g. --tp 1; see 'ndmesh plan memory --help'" ||
  fail "memory tp not a number: message: $out"

# A custom model from flags.
expect_rc 0 "custom model" -- "$ndmesh" plan --layers 24 --hidden 2048 --heads 16 --vocab 32000 --seq 2048 \
  --mlp swiglu --ffn 5632 --gpus 8 --global-batch 64 --top 1

# A custom model from a TOML [model] section: GPT-2 small, 12*(12*768^2 + 13*768) + (50304 +
# 1024)*768 + 2*768 = 124,475,904 parameters.
toml=$(mktemp --suffix=.toml)
trap 'rm -f "$toml"' EXIT
printf '[model]\nname = "gpt2-small"\nlayers = 12\nhidden = 768\nheads = 12\nvocab = 50304\nseq = 1024\n' >"$toml"
expect_rc 0 "toml model" -- "$ndmesh" plan memory --config "$toml" --json
echo "$out" | grep -q '"parameters": 124475904' || fail "toml model: parameters: $out"
expect_rc 2 "missing toml" -- "$ndmesh" plan --config /nonexistent/model.toml --gpus 2 --global-batch 4
echo "$out" | grep -q "/nonexistent/model.toml" || fail "missing toml: message: $out"

# The serial model `ndmesh train` runs by default (2 layers, h 64, 4 heads, 2 kv heads, ffn
# 256, vocab 32, seq 64, biases, learned positions, tied): per layer 3*64*64 + 2*64*32 +
# 2*64*256 weights + 512 biases + 256 norm = 45,824; x2 + 32*64 + 64*64 + 128 = 97,920.
# fp32 AdamW keeps 4 + 4 + 8 bytes per stored parameter, and the vocabulary is stored padded to
# 64 rows (+32 x 64): 8 x 99,968 = 799,744 bytes of optimizer state.
expect_rc 0 "trainer model" -- "$ndmesh" plan memory --layers 2 --hidden 64 --heads 4 --kv-heads 2 --vocab 32 \
  --seq 64 --micro-batch 16 --mlp gelu --no-dropout --precision fp32 --json
echo "$out" | grep -q '"parameters": 97920' || fail "trainer model: parameters: $out"
echo "$out" | grep -q '"optimizer": 799744' || fail "trainer model: 8 B of optimizer state each: $out"
# --untied, as `ndmesh train --untied`: the output layer adds 32 x 64 = 2,048 parameters.
expect_rc 0 "trainer model untied" -- "$ndmesh" plan memory --layers 2 --hidden 64 --heads 4 --kv-heads 2 \
  --vocab 32 --seq 64 --micro-batch 16 --mlp gelu --no-dropout --precision fp32 --untied --json
echo "$out" | grep -q '"parameters": 99968' || fail "trainer model untied: parameters: $out"
expect_rc 2 "bad precision" -- "$ndmesh" plan memory --model llama3-8b --precision fp8
echo "$out" | grep -q "'fp8'" || fail "bad precision: message: $out"

# ZeRO-3 is planned again: plan memory --zero 3 works, and a large model on few GPUs ranks a
# ZeRO-3 layout first (it fits in 4 GPUs without tp); --max-zero 2 keeps it out.
expect_rc 0 "zero 3 memory" -- "$ndmesh" plan memory --model llama3-8b --dp 8 --global-batch 8 --zero 3 --json
echo "$out" | jq -e '.zero == 3 and .memory_bytes.params < 3e9' > /dev/null || fail "zero 3 memory: $out"
expect_rc 0 "zero 3 ranked" -- "$ndmesh" plan --model llama3-8b --gpus 4 --global-batch 16 --top 1 --json
echo "$out" | jq -e '.layouts[0].zero == 3' > /dev/null || fail "zero 3 ranked: not first: $out"
expect_rc 0 "max zero 2" -- "$ndmesh" plan --model llama3-8b --gpus 4 --global-batch 16 --top 1 --max-zero 2 --json
echo "$out" | jq -e '.layouts[0].zero <= 2' > /dev/null || fail "max zero 2: $out"
# --memory expands (printed), explicit flags win; extreme offloads at the disk rates.
expect_rc 0 "memory aggressive" -- "$ndmesh" plan memory --model llama3-8b --dp 8 --global-batch 8 --memory aggressive
echo "$out" | grep -q "memory: aggressive = --recompute full --zero 2" || fail "memory aggressive: $out"
expect_rc 0 "memory extreme" -- "$ndmesh" plan memory --model llama3-8b --dp 8 --global-batch 8 --memory extreme \
  --zero 1 --disk-read-gbps 4 --disk-write-gbps 2 --json
echo "$out" | jq -e '.zero == 1 and .recompute == "full" and .offload == "optimizer" and .memory_bytes.optimizer == 0 and
  .memory_bytes.optimizer_offloaded > 0 and (.time_s.offload - 8 * .memory_bytes.optimizer_offloaded * (1/4e9 + 1/2e9) | fabs) < 1e-6' \
  > /dev/null || fail "memory extreme: $out"
expect_rc 0 "memory search" -- "$ndmesh" plan --model llama3-8b --gpus 8 --global-batch 16 --memory aggressive --top 3 --json
echo "$out" | jq -e '[.layouts[] | .zero == 2 and .recompute == "full"] | all' > /dev/null || fail "memory search: $out"
expect_rc 2 "offload without disk rates" -- "$ndmesh" plan memory --model llama3-8b --dp 8 --global-batch 8 --offload optimizer
echo "$out" | grep -q "ndmesh calibrate" || fail "offload without disk rates: $out"
# --offload-to host (ndmesh train --device cuda --offload optimizer): pinned host bytes (fp32:
# the 8 B of moments plus the 4 B master copy per shard element) and the shard's gradients
# to the host and parameters back (4 + 4 B) at the preset's host link rate; no disk rates.
expect_rc 0 "offload to host" -- "$ndmesh" plan memory --model llama3-8b --dp 8 --global-batch 8 --zero 1 \
  --precision fp32 --offload optimizer --offload-to host --json
echo "$out" | jq -e '.offload_to == "host" and .memory_bytes.optimizer == 0 and .memory_bytes.optimizer_offloaded > 0 and
  (.memory_bytes.optimizer_host / .memory_bytes.optimizer_offloaded - 1.5 | fabs) < 1e-9 and
  (.offload_bytes_per_step - .memory_bytes.optimizer_offloaded | fabs) < 1 and
  (.time_s.offload - .offload_bytes_per_step / 64e9 | fabs) < 1e-9' > /dev/null || fail "offload to host: $out"
expect_rc 2 "offload to host without a link rate" -- "$ndmesh" plan memory --model llama3-8b --dp 8 --global-batch 8 \
  --offload optimizer --offload-to host --host-link-gbps 0
echo "$out" | grep -q -- "--host-link-gbps" || fail "offload to host without a link rate: $out"
expect_rc 2 "bad offload-to" -- "$ndmesh" plan memory --model llama3-8b --offload optimizer --offload-to nvme
echo "$out" | grep -q -- "--offload-to=nvme is not a place" || fail "bad offload-to: $out"
# ZeRO 2 keeps what ZeRO 3 keeps of the gradients: the shard plus two layers' full gradients
# (both reduce-scatter unit by unit during the backward).
expect_rc 0 "zero 2 grads" -- "$ndmesh" plan memory --model llama3-8b --dp 8 --global-batch 8 --zero 2 --json
z2=$(echo "$out" | jq .memory_bytes.grads)
expect_rc 0 "zero 3 grads" -- "$ndmesh" plan memory --model llama3-8b --dp 8 --global-batch 8 --zero 3 --json
[ "$z2" = "$(echo "$out" | jq .memory_bytes.grads)" ] || fail "zero 2 grads $z2 differ from zero 3's: $out"
expect_rc 2 "bad memory" -- "$ndmesh" plan memory --model llama3-8b --memory huge
echo "$out" | grep -q -- "--memory=huge is not a memory strategy" || fail "bad memory: $out"

# A mixture of experts: the header gives total and active parameters (Mixtral 8x7B: 46.7B,
# 12.9B), the table an ep column (folded into dp x cp: it divides dp and the 8 experts), the
# command carries the experts and --ep, --explain the all-to-all's term.
expect_rc 0 "moe search" -- "$ndmesh" plan --model mixtral-8x7b --gpus 64 --seq 4096 --global-batch 512 --top 5 \
  --explain
echo "$out" | grep -q "46.70B parameters (12.88B active: top-2 of 8 experts)" || fail "moe search: header: $out"
echo "$out" | grep -qE '^rank +tp +cp +pp +dp +ep ' || fail "moe search: no ep column: $out"
rows=$(echo "$out" | grep -E '^ +[1-5] +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ ' |
  awk '($5 * $3) % $6 != 0 || 8 % $6 != 0 { bad++ } END { print NR - bad }')
[ "$rows" -eq 5 ] || fail "moe search: want 5 rows whose ep divides dp x cp and 8: $out"
echo "$out" | grep 'this machine:' | head -1 | grep -q -- "--experts 8 --top-k 2" || fail "moe search: command: $out"
echo "$out" | grep -q "^  expert parallel " || fail "moe search: no expert parallel term: $out"
expect_rc 0 "moe ep constraint" -- "$ndmesh" plan --model mixtral-8x7b --gpus 64 --seq 4096 --global-batch 512 \
  --top 3 --ep 8 --json
[ "$(echo "$out" | jq '[.layouts[].ep] | unique')" = "$(printf '[\n  8\n]')" ] || fail "moe --ep 8: $out"
expect_rc 2 "moe ep not dividing experts" -- "$ndmesh" plan --model mixtral-8x7b --gpus 64 --global-batch 512 --ep 3
[[ "$out" == "ndmesh: [plan] --ep 3 conflicts with the model: experts=8 is not divisible by ep=3"* ]] &&
  [ "$(echo "$out" | wc -l)" -eq 1 ] || fail "moe --ep 3: $out"
expect_rc 2 "ep with a dense model" -- "$ndmesh" plan --model llama3-8b --gpus 8 --global-batch 8 --ep 2
echo "$out" | grep -q -- "--ep 2 needs a mixture of experts" || fail "dense --ep 2: $out"
expect_rc 2 "plan memory ep not dividing dp" -- "$ndmesh" plan memory --model mixtral-8x7b --dp 4 --ep 8
echo "$out" | grep -q "ep=8 must divide dp\*cp = 4\*1 = 4" || fail "plan memory --dp 4 --ep 8: $out"
expect_rc 2 "plan memory ep 0" -- "$ndmesh" plan memory --model mixtral-8x7b --dp 4 --ep 0
echo "$out" | grep -q -- "--ep 0 must be at least 1" || fail "plan memory --ep 0: $out"

[ "$failures" -eq 0 ] && echo "plan.sh: all passed"
exit $((failures > 0))
