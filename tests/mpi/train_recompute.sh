#!/usr/bin/env bash
# Activation recompute (--recompute none|selective|full) with real processes, for the
# serial run, tp 2 with sequence parallelism, pp 2 (1f1b, interleaved with 2 virtual
# stages, gpipe), cp 2, dp 2 with micro-batches and ZeRO 2, and dp 2 x pp 2 x tp 2:
#  (a) the per-step losses of the three modes are the same bit for bit (the JSON numbers
#      compared as strings);
#  (b) the measured activation bytes (memory_bytes.activations and every rank's) fall
#      strictly: none > selective > full;
#  (c) each mode's measured bytes of the pipeline stage `ndmesh plan memory` reports as its
#      worst agree with the plan's activations for the same model and layout (fp32, no
#      dropout, flash attention, GPT shape) within 10% (the ratio is printed). Measured:
#      0.5-1.2% above the plan in every mode and layout (what the plan leaves out: the
#      per-token norm statistics, the tokens and targets, a stage's input);
#  (d) every layout's losses equal the serial run's within 1e-5.
# Also: --recompute with a bad value, and selective/full with --schedule zb-h1, exit 2 with
# one line naming the flag.
#   train_recompute.sh <mpirun command...> <path to ndmesh>
source "$(dirname "$0")/train_lib.sh" "$@"

model=(--layers 4 --hidden 64 --heads 4 --kv-heads 2 --seq 32 --vocab 32)
batch=8
common=("${model[@]}" --markov-vocab 32 --batch $batch --steps 3 --threads 1 --eval-batches 1 --json)

# run <name> <ranks> <plan flags> <train flags...>: the three modes, checks (a)-(c).
run() {
  local name=$1 np=$2 plan_flags=$3
  shift 3
  local mode prev="" prev_bytes=""
  for mode in none selective full; do
    local out="$tmp/$name.$mode"
    if [ "$np" -gt 1 ]; then
      "${mpirun[@]}" -np "$np" "$ndmesh" train "${common[@]}" "$@" --recompute $mode > "$out.out" 2> "$out.err" ||
        fail "$name $mode: exit $? $(tail -3 "$out.err")"
    else
      "$ndmesh" train "${common[@]}" "$@" --recompute $mode > "$out.out" 2> "$out.err" ||
        fail "$name $mode: exit $? $(tail -3 "$out.err")"
    fi
    tail -n 1 "$out.out" > "$out.json"
    jq -e --arg m $mode '.recompute == $m and (.losses | length == 3)' "$out.json" > /dev/null ||
      fail "$name $mode: no recompute field or no 3 losses"
    grep -q "activations: recompute $mode, measured peak" "$out.out" || fail "$name $mode: no activations line"
    # (a) the losses as printed, character for character.
    grep -o '"losses":\[[^]]*\]' "$out.json" > "$out.losses"
    if [ -n "$prev" ]; then
      cmp -s "$tmp/$name.none.losses" "$out.losses" ||
        fail "$name: --recompute $mode losses $(cat "$out.losses") differ from none's $(cat "$tmp/$name.none.losses")"
    fi
    # (b) every rank's bytes below the previous mode's.
    local bytes
    bytes=$(jq -c '.activation_bytes_per_rank' "$out.json")
    jq -e '.memory_bytes.activations == .activation_bytes_per_rank[0] and (.activation_bytes_per_rank | all(. > 0))' \
      "$out.json" > /dev/null || fail "$name $mode: bad activation bytes $bytes"
    if [ -n "$prev_bytes" ]; then
      jq -n -e --argjson a "$prev_bytes" --argjson b "$bytes" '[$a, $b] | transpose | all(.[0] > .[1])' > /dev/null ||
        fail "$name: --recompute $mode activation bytes $bytes are not below $prev's $prev_bytes"
    fi
    # (c) against the plan.
    local plan stage planned measured ratio
    # shellcheck disable=SC2086
    plan=$("$ndmesh" plan memory "${model[@]}" --mlp gelu --no-dropout --precision fp32 --attention flash \
      --global-batch $batch $plan_flags --recompute $mode --json) || fail "$name $mode: ndmesh plan memory failed"
    stage=$(echo "$plan" | jq '.worst_stage')
    planned=$(echo "$plan" | jq '.memory_bytes.activations')
    measured=$(jq --argjson s "$stage" '.activation_bytes_per_stage[$s]' "$out.json")
    ratio=$(awk -v m="$measured" -v p="$planned" 'BEGIN { printf "%.4f", m / p }')
    echo "$name --recompute $mode: losses identical to none; activation bytes per rank $bytes;" \
      "stage $stage measured $measured, planned $planned, measured/planned $ratio"
    awk -v r="$ratio" 'BEGIN { exit !(r >= 0.9 && r <= 1.1) }' ||
      fail "$name --recompute $mode: measured/planned activation bytes $ratio is outside [0.9, 1.1]"
    prev=$mode
    prev_bytes=$bytes
  done
  # (d) and the layout reproduces the serial run.
  [ "$name" = serial ] || expect_same "$name vs serial" "$tmp/serial.none.json" "$tmp/$name.none.json"
}

run serial 1 "--tp 1 --cp 1 --pp 1 --dp 1 --micro-batch $batch"
run tp2_sp 2 "--tp 2 --cp 1 --pp 1 --dp 1 --micro-batch $batch --sequence-parallel" --tp 2 --sequence-parallel
run pp2_1f1b 2 "--tp 1 --cp 1 --pp 2 --dp 1 --micro-batch 2 --schedule 1f1b" --pp 2 --micro-batch 2
run pp2_interleaved 2 "--tp 1 --cp 1 --pp 2 --dp 1 --micro-batch 2 --schedule interleaved --vpp 2" \
  --pp 2 --micro-batch 2 --schedule interleaved --virtual-stages 2
run pp2_gpipe 2 "--tp 1 --cp 1 --pp 2 --dp 1 --micro-batch 2 --schedule gpipe" --pp 2 --micro-batch 2 --schedule gpipe
run cp2 2 "--tp 1 --cp 2 --pp 1 --dp 1 --micro-batch $batch" --cp 2
run dp2_zero2 2 "--tp 1 --cp 1 --pp 1 --dp 2 --micro-batch 2 --zero 2" --dp 2 --micro-batch 2 --zero 2
run dp2_pp2_tp2 8 "--tp 2 --cp 1 --pp 2 --dp 2 --micro-batch 2 --schedule 1f1b" --dp 2 --pp 2 --tp 2 --micro-batch 2

expect_train_usage "--recompute=partial is not a recompute mode (none, selective, full)" 1 "${common[@]}" \
  --recompute partial
for mode in selective full; do
  expect_train_usage "--recompute with --schedule zb-h1" 2 "${common[@]}" --pp 2 --micro-batch 2 \
    --schedule zb-h1 --recompute $mode
done
echo "train_recompute: OK"
