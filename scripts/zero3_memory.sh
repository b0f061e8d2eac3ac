#!/usr/bin/env bash
# Measured vs planned memory per rank for ZeRO-3, ZeRO-2 and ZeRO-1 (and ZeRO 0 beside them) on
# dp 1, 2 and 4. Each layout trains the same model for STEPS steps with --json; its last line gives the
# trainer's tally of what it allocated (memory_bytes: params with the measured gathered units,
# grads, optimizer, the measured gradient work space, activations and activation buffers) and
# the process's peak resident set (peak_rss, ru_maxrss of the fullest rank). `ndmesh plan
# memory` predicts the same layout (fp32 AdamW, no dropout, flash attention, the same micro-
# batch) from its formulas. The table prints both, per field and in total, with the ratio
# plan / measured; the goal is within 10% for the totals of every ZeRO row (ZeRO-2 and -3 both
# reduce-scatter unit by unit during the backward and keep about two units' full-size
# gradients beside the shard).
#   scripts/zero3_memory.sh [path/to/ndmesh]
# Environment: STEPS (default 2), MODEL (train flags of the model; default 8 blocks of width
# 256, about 6.4M parameters), BATCH (sequences per step, 8), MICRO (micro-batch, 2),
# LAYOUTS (a list of DP:ZERO, default "1:0 2:0 2:2 2:3 4:0 4:2 4:3"), CHECK=1 to exit 1 when
# a row's tracked total is off the plan by more than 10% (ctest mpi.zero3_memory runs it so on
# a small GPT-2, mpi.llama_memory on a small Llama: --arch llama in MODEL), MPIRUN (the mpirun
# program, default mpirun).
set -euo pipefail
ndmesh=${1:-build/bin/ndmesh}
steps=${STEPS:-2}
batch=${BATCH:-8}
micro=${MICRO:-2}
model=${MODEL:-"--layers 8 --hidden 256 --heads 8 --kv-heads 8 --seq 64 --vocab 256"}
layouts=${LAYOUTS:-"1:0 2:0 2:2 2:3 4:0 4:2 4:3"}
command -v jq > /dev/null || { echo "zero3_memory.sh: needs jq (apt-get install jq)" >&2; exit 2; }
mpirun=("${MPIRUN:-mpirun}" --allow-run-as-root --oversubscribe)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The trainer's data: a Markov source over the model's vocabulary (--vocab is the planner's).
vocab=$(echo "$model" | sed -n 's/.*--vocab \([0-9]*\).*/\1/p')
train_model=$(echo "$model" | sed 's/--vocab [0-9]*/--markov-vocab '"$vocab"'/')

mib() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1048576 }'; }
ratio() { awk -v p="$1" -v m="$2" 'BEGIN { if (m == 0) print "-"; else printf "%.3f", p / m }'; }
printf '%-12s | %15s | %15s | %15s | %15s | %23s | %9s\n' "" "params MiB" "grads MiB" "optimizer MiB" \
  "activations MiB" "total MiB (ratio)" "peak RSS"
printf '%-12s | %7s %7s | %7s %7s | %7s %7s | %7s %7s | %7s %7s %7s | %9s\n' layout plan meas plan meas plan meas \
  plan meas plan meas ratio MiB
fail=0
for l in $layouts; do
  dp=${l%%:*} zero=${l##*:}
  name="dp $dp zero $zero"
  # shellcheck disable=SC2086
  flags=($train_model --batch "$batch" --micro-batch "$micro" --steps "$steps" --warmup 0 --eval-batches 0 --threads 1
    --dp "$dp" --zero "$zero" --json)
  if [ "$dp" -gt 1 ]; then
    "${mpirun[@]}" -np "$dp" "$ndmesh" train "${flags[@]}" > "$tmp/out" 2> "$tmp/err" ||
      { echo "$name: ndmesh train failed: $(tail -2 "$tmp/err")" >&2; exit 1; }
  else
    "$ndmesh" train "${flags[@]}" > "$tmp/out" 2> "$tmp/err" ||
      { echo "$name: ndmesh train failed: $(tail -2 "$tmp/err")" >&2; exit 1; }
  fi
  meas=$(tail -n 1 "$tmp/out")
  # shellcheck disable=SC2086
  plan=$("$ndmesh" plan memory $model --precision fp32 --no-dropout --attention flash --global-batch "$batch" \
    --micro-batch "$micro" --dp "$dp" --zero "$zero" --json)
  p() { echo "$plan" | jq -r ".memory_bytes.$1"; }
  # Measured: the gradients kept (shard) plus the work space the backward writes into;
  # the activations plus the buffers beside them.
  m_params=$(echo "$meas" | jq '.memory_bytes.params')
  m_grads=$(echo "$meas" | jq '.memory_bytes.grads + .memory_bytes.grad_workspace')
  m_opt=$(echo "$meas" | jq '.memory_bytes.optimizer')
  m_act=$(echo "$meas" | jq '.memory_bytes.activations + .memory_bytes.activation_buffers')
  m_total=$(echo "$meas" | jq '.memory_bytes | .params + .grads + .grad_workspace + .optimizer + .activations
    + .activation_buffers')
  r=$(ratio "$(p total)" "$m_total")
  printf '%-12s | %7s %7s | %7s %7s | %7s %7s | %7s %7s | %7s %7s %7s | %9s\n' "$name" \
    "$(mib "$(p params)")" "$(mib "$m_params")" "$(mib "$(p grads)")" "$(mib "$m_grads")" \
    "$(mib "$(p optimizer)")" "$(mib "$m_opt")" "$(mib "$(p activations)")" "$(mib "$m_act")" \
    "$(mib "$(p total)")" "$(mib "$m_total")" "$r" "$(mib "$(echo "$meas" | jq .memory_bytes.peak_rss)")"
  if ! awk -v r="$r" 'BEGIN { exit !(r >= 0.9 && r <= 1.1) }'; then
    echo "  ZeRO-$zero on dp $dp: plan / measured $r is outside [0.9, 1.1]" >&2
    fail=1
  fi
done
echo "model: $model, batch $batch, micro-batch $micro, $steps steps; measured: ndmesh train --json memory_bytes"
echo "(grads = shard + grad_workspace, activations = activations + activation_buffers); planned: ndmesh plan memory"
echo "--precision fp32 --no-dropout --attention flash. peak RSS: the fullest rank's whole process."
if [ "${CHECK:-0}" = 1 ] && [ "$fail" = 1 ]; then exit 1; fi
exit 0
