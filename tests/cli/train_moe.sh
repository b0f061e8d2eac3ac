#!/usr/bin/env bash
# `ndmesh train` with a mixture of experts: the moe-tiny preset trains serially (the language-model
# loss goes down over a few steps, the auxiliary loss is reported apart, the routing's load counts
# every token's k assignments), the flags over a preset, bf16 products, a checkpoint that keeps
# the MoE description and continues the same run, bad values naming the flag (exit 2).
set -euo pipefail
ndmesh=${1:?usage: train_moe.sh path/to/ndmesh}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
run=(--batch 4 --seq 32 --threads 1 --eval-batches 1 --warmup 0 --lr 3e-3)

USAGE_LINES=1
source "$(dirname "$0")/../support/expect_usage.sh"

# moe-tiny, 8 steps: its loss goes down, aux_loss is in the step line and aux_losses in the JSON.
"$ndmesh" train --model moe-tiny --steps 8 --log-every 1 --json "${run[@]}" > "$tmp/moe.txt"
grep -qF "experts: 4 routed (top-2, softmax router), expert ffn 64" "$tmp/moe.txt" ||
  fail "moe-tiny: $(grep '^experts' "$tmp/moe.txt")"
grep -q "^step 1/8 loss [0-9.]* aux_loss [0-9.]* load_max [0-9.]* lr" "$tmp/moe.txt" ||
  fail "no aux_loss and load_max in the step line: $(grep '^step 1/' "$tmp/moe.txt")"
# load_max: the largest max / mean tokens per expert of a block, from the JSON's loads of that step.
shown=$(sed -n 's/^step 1\/8 .* load_max \([0-9.]*\) lr.*/\1/p' "$tmp/moe.txt")
jq -e --argjson shown "$shown" \
  '.expert_loads[0] | [(.[0:4] | max / (add / 4)), (.[4:8] | max / (add / 4))] | max | (. - $shown) | fabs <= 0.005' \
  <(tail -n 1 "$tmp/moe.txt") > /dev/null ||
  fail "load_max $shown of step 1 is not the largest max/mean of $(tail -n 1 "$tmp/moe.txt" | jq -c '.expert_loads[0]')"
tail -n 1 "$tmp/moe.txt" > "$tmp/moe.json"
jq -e '.losses[-1] < .losses[0] - 0.05' "$tmp/moe.json" > /dev/null ||
  fail "moe-tiny's loss does not go down: $(jq -c .losses "$tmp/moe.json")"
jq -e '(.aux_losses | length) == 8 and all(.aux_losses[]; . > 0)' "$tmp/moe.json" > /dev/null ||
  fail "aux_losses: $(jq -c .aux_losses "$tmp/moe.json")"
# Two MoE blocks of 4 experts; each step routes 4 sequences x 32 tokens x top-2 per block.
jq -e '(.expert_loads | length) == 8 and all(.expert_loads[]; length == 8 and (.[0:4] | add) == 256 and (.[4:8] | add) == 256)' \
  "$tmp/moe.json" > /dev/null || fail "expert_loads: $(jq -c '.expert_loads[0]' "$tmp/moe.json")"

# The flags over a preset: a sigmoid router, a shared expert, a dense first block, a capacity.
"$ndmesh" train --model llama-tiny --experts 3 --top-k 1 --shared-experts 1 --expert-ffn 32 --moe-first-dense 1 \
  --router sigmoid --aux-loss 0 --capacity-factor 1.5 --steps 2 --log-every 1 "${run[@]}" > "$tmp/flags.txt"
grep -qF "experts: 3 routed (top-1, sigmoid router) + 1 shared, expert ffn 32, MoE blocks: every 1 after the first 1 dense; aux loss 0, capacity factor 1.5" \
  "$tmp/flags.txt" || fail "the MoE flags: $(grep '^experts' "$tmp/flags.txt")"

# Dense and MoE blocks mixed (MoE, dense, MoE: the first block's sizes are not the largest), also
# under full recompute: the shared scratch and workspace hold either block's tensors, and the
# losses are bit for bit those without recompute.
mixed=(--model moe-tiny --layers 3 --moe-every 2 --shared-experts 1 --steps 3 --json "${run[@]}")
"$ndmesh" train "${mixed[@]}" | tail -n 1 > "$tmp/mixed.json"
"$ndmesh" train "${mixed[@]}" --recompute full | tail -n 1 > "$tmp/mixed_full.json"
jq -e -n --slurpfile a "$tmp/mixed.json" --slurpfile b "$tmp/mixed_full.json" \
  '$a[0].losses == $b[0].losses and $a[0].grad_norms == $b[0].grad_norms and $a[0].aux_losses == $b[0].aux_losses' \
  > /dev/null || fail "--recompute full changes the mixed MoE run: $(jq -c .losses "$tmp/mixed_full.json")"
# The same under bf16 products (the experts' products in bf16, the router in fp32): recompute
# changes no bit, and the run tracks fp32 (losses within 1%) without being it (step-1 norms).
"$ndmesh" train "${mixed[@]}" --precision bf16 | tail -n 1 > "$tmp/mixed16.json"
"$ndmesh" train "${mixed[@]}" --precision bf16 --recompute full | tail -n 1 > "$tmp/mixed16_full.json"
jq -e -n --slurpfile a "$tmp/mixed16.json" --slurpfile b "$tmp/mixed16_full.json" \
  '$a[0].precision == "bf16" and $a[0].losses == $b[0].losses and $a[0].grad_norms == $b[0].grad_norms and
   $a[0].aux_losses == $b[0].aux_losses' > /dev/null ||
  fail "--precision bf16 --recompute full changes the mixed MoE run: $(jq -c .losses "$tmp/mixed16_full.json")"
jq -e -n --slurpfile a "$tmp/mixed.json" --slurpfile b "$tmp/mixed16.json" \
  '([$a[0].losses, $b[0].losses] | transpose | all((.[0] - .[1]) / .[0] | fabs < 0.01)) and
   ((($a[0].grad_norms[0] - $b[0].grad_norms[0]) / $a[0].grad_norms[0] | fabs) > 1e-6)' > /dev/null ||
  fail "bf16 MoE losses $(jq -c .losses "$tmp/mixed16.json") vs fp32 $(jq -c .losses "$tmp/mixed.json")"

# A checkpoint keeps the MoE description: --load alone continues the same run.
"$ndmesh" train --model moe-tiny --router sigmoid --steps 4 --until 2 --json --save "$tmp/ck" "${run[@]}" |
  tail -n 1 > /dev/null
jq -e '.model.experts == 4 and .model.top_k == 2 and .model.expert_ffn == 64 and .model.router == "sigmoid"' \
  "$tmp/ck/manifest.json" > /dev/null || fail "manifest: $(jq -c .model "$tmp/ck/manifest.json")"
"$ndmesh" train --model moe-tiny --router sigmoid --steps 4 --json "${run[@]}" | tail -n 1 > "$tmp/whole.json"
"$ndmesh" train --steps 4 --json --load "$tmp/ck" "${run[@]}" > "$tmp/resumed.txt"
grep -qF "experts: 4 routed (top-2, sigmoid router)" "$tmp/resumed.txt" || fail "--load: $(grep '^experts' "$tmp/resumed.txt")"
tail -n 1 "$tmp/resumed.txt" > "$tmp/resumed.json"
jq -e -n --slurpfile a "$tmp/whole.json" --slurpfile b "$tmp/resumed.json" '$a[0].losses[2:] == $b[0].losses' > /dev/null ||
  fail "resumed losses $(jq -c .losses "$tmp/resumed.json") differ from the whole run's $(jq -c '.losses[2:]' "$tmp/whole.json")"
expect_usage "experts: checkpoint has 4, the run has 2" "$ndmesh" train --model moe-tiny --experts 2 --steps 4 --load "$tmp/ck" \
  "${run[@]}"

# Bad values: one line naming the flag, exit 2.
expect_usage "--top-k=5 must be between 1 and --experts=4" "$ndmesh" train --model moe-tiny --top-k 5
expect_usage "--capacity-factor=-1 must be 0 (dropless) or a positive number" "$ndmesh" train --model moe-tiny --capacity-factor -1
expect_usage "--aux-loss=-0.5 must be 0 or a positive number" "$ndmesh" train --model moe-tiny --aux-loss -0.5
expect_usage "--moe-every=0 must be at least 1" "$ndmesh" train --model moe-tiny --moe-every 0
expect_usage "--router=hash is not a router; use softmax (Mixtral) or sigmoid (DeepSeek-V3)" "$ndmesh" train --model moe-tiny --router hash
expect_usage "MoE layers have no biases" "$ndmesh" train --experts 4 --steps 1
echo "train_moe.sh: ok"
