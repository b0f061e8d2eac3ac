#!/usr/bin/env bash
# Llama under every strategy, with real processes: a 4-block Llama (--arch llama: RMSNorm,
# SwiGLU, rotary positions, no biases, untied head; hidden 32, 4 heads over 2 key/value heads,
# MLP 64, seq 16) trains 8 steps under each layout, and each run's losses and gradient norms
# must equal the serial Llama run's within compare_runs.sh's bounds (losses 1e-5). Covered:
# dp 2 with ZeRO 0-3 and micro-batches, optimizer offload, tp 2 with sequence parallelism,
# pp 2 under gpipe, 1f1b, interleaved (2 virtual stages) and zb-h1, cp 2 zigzag and
# contiguous, full and selective recompute (losses and norms bit for bit), dp x pp x tp and pp x cp x tp, a
# checkpoint saved under dp 2 x tp 2 and continued serially; and bf16 under dp 2 x tp 2 against
# the serial bf16 run (train_bf16.sh's bounds). The serial Llama run must differ from the
# serial GPT-2 run of the same sizes (the description reaches the layers).
#   train_llama.sh <mpirun command...> <path to ndmesh>
source "$(dirname "$0")/train_lib.sh" "$@"

steps=8
sizes=(--layers 4 --hidden 32 --heads 4 --kv-heads 2 --ffn 64 --seq 16 --markov-vocab 16 --threads 1 --eval-batches 1
  --warmup 2 --batch 8 --steps $steps --json)
common=(--arch llama "${sizes[@]}")

serial_run llama
grep -qF "architecture: llama: rmsnorm (eps 1e-05), swiglu MLP, rope positions (theta 500000), no biases" \
  "$tmp/llama.out" || fail "the serial run does not print the Llama description: $(grep architecture "$tmp/llama.out")"
grep -qF "untied head" "$tmp/llama.out" || fail "the Llama head is not untied: $(grep '^model' "$tmp/llama.out")"
"$ndmesh" train --arch gpt2 "${sizes[@]}" | tail -n 1 > "$tmp/gpt2.json"
d=$(run_diffs "$tmp/llama.json" "$tmp/gpt2.json" 0)
read -r l _ _ <<< "$d"
echo "serial llama vs serial gpt2 of the same sizes: losses differ by $l"
awk -v d="$l" 'BEGIN{exit !(d > 1e-3)}' || fail "the Llama and GPT-2 runs are $l apart: the description did not reach the layers"

bitwise() {  # bitwise <a> <b>: the same losses and gradient norms bit for bit
  jq -e -n --slurpfile a "$tmp/$1.json" --slurpfile b "$tmp/$2.json" \
    '$a[0].losses == $b[0].losses and $a[0].grad_norms == $b[0].grad_norms' > /dev/null ||
    fail "llama $2 is not bit-identical to $1"
  echo "llama $2: losses and gradient norms bit-identical to $1"
}

# Data parallel and ZeRO.
layout_run llama 2 dp2 --dp 2
layout_run llama 2 dp2_zero1_micro --dp 2 --zero 1 --micro-batch 2
layout_run llama 2 dp2_zero2_micro --dp 2 --zero 2 --micro-batch 2
layout_run llama 2 dp2_zero3 --dp 2 --zero 3
mkdir -p "$tmp/offload"
layout_run llama 2 dp2_offload --dp 2 --zero 1 --offload optimizer --offload-dir "$tmp/offload"
# Tensor parallel (the SwiGLU's two column-parallel matrices, the rotary heads split).
layout_run llama 2 tp2_sp --tp 2 --sequence-parallel
# Pipelines: every schedule (the untied head on the last stage).
layout_run llama 2 pp2_gpipe --pp 2 --schedule gpipe --micro-batch 2
layout_run llama 2 pp2_1f1b --pp 2 --schedule 1f1b --micro-batch 1
layout_run llama 2 pp2_interleaved --pp 2 --schedule interleaved --virtual-stages 2 --micro-batch 2
layout_run llama 2 pp2_zbh1 --pp 2 --schedule zb-h1 --micro-batch 2
# Context parallel: ring attention with the rotary positions of each rank's chunks.
layout_run llama 2 cp2_zigzag --cp 2
layout_run llama 2 cp2_contiguous --cp 2 --cp-layout contiguous
# Compositions.
layout_run llama 8 dp2_pp2_tp2_sp --dp 2 --pp 2 --tp 2 --sequence-parallel --micro-batch 2
layout_run llama 8 pp2_cp2_tp2 --pp 2 --cp 2 --tp 2 --micro-batch 2
# Recompute: the same losses bit for bit.
serial_run llama_full --recompute full
bitwise llama llama_full
serial_run llama_selective --recompute selective
bitwise llama llama_selective
# A checkpoint saved under dp 2 x tp 2 at step 4, continued serially to step 8.
"${mpirun[@]}" -np 4 "$ndmesh" train "${common[@]}" --dp 2 --tp 2 --until 4 --save "$tmp/ck" > "$tmp/save.out" 2>&1 ||
  fail "save under dp 2 x tp 2: $(tail -5 "$tmp/save.out")"
jq -e '.model.norm == "rmsnorm" and .model.mlp == "swiglu" and .model.positions == "rope"' "$tmp/ck/manifest.json" \
  > /dev/null || fail "the manifest does not describe the Llama model: $(jq -c .model "$tmp/ck/manifest.json")"
"$ndmesh" train "${common[@]}" --load "$tmp/ck" 2> "$tmp/resume.err" | tail -n 1 > "$tmp/resumed.json" ||
  fail "serial load: $(cat "$tmp/resume.err")"
expect_same "llama saved under dp2 x tp2, resumed serially" "$tmp/llama.json" "$tmp/resumed.json" --from 4
# bf16 against the serial bf16 run (the bounds of train_bf16.sh).
serial_run llama_bf16 --precision bf16
LOSS_BOUND=2e-4 GRAD1_BOUND=1e-5 GRAD_BOUND=5e-3
layout_run llama_bf16 4 dp2_tp2_sp_bf16 --dp 2 --tp 2 --sequence-parallel --precision bf16
echo "train_llama.sh: ok"
