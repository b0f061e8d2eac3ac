#!/usr/bin/env bash
# One set of rules (issue 22 item 7): every layout `ndmesh plan` ranks for the small model of
# `ndmesh train` is one `ndmesh train` runs. The planner's own command for each of its top
# layouts (the "train_flags" of --json, what `plan` prints after `ndmesh launch -n N --
# ndmesh train`) trains 2 steps on 4 ranks and exits 0. Layouts the trainer refuses (tp
# over the 2 kv heads, zb-h1 with recompute, ZeRO 3, ...) must not appear. The flag names of
# train, plan and schedule are the same, each with its alias (--global-batch/--batch,
# --vpp/--virtual-stages).
#   plan_runs.sh <mpirun command...> <path to ndmesh>
source "$(dirname "$0")/train_lib.sh" "$@"

model=(--layers 4 --hidden 32 --heads 4 --kv-heads 2 --ffn 64 --vocab 16 --mlp gelu --untied)
train_extra=(--markov-vocab 16 --threads 1 --eval-batches 1 --warmup 1 --steps 2)

for attempt in "--gpus 4 --seq 32 --global-batch 16 --top 4" "--gpus 4 --seq 32 --global-batch 8 --pp 2 --top 3" \
  "--gpus 4 --seq 32 --global-batch 8 --cp 2 --top 3" "--gpus 4 --seq 32 --global-batch 8 --pp 4 --schedules zb-h1,interleaved --top 3" \
  "--gpus 4 --seq 32 --global-batch 8 --tp 2 --recompute selective,full --top 2"; do
  # shellcheck disable=SC2086
  "$ndmesh" plan "${model[@]}" $attempt --no-dropout --precision fp32 --json > "$tmp/plan.json" ||
    fail "plan $attempt: exit $?"
  n=$(jq '.layouts | length' "$tmp/plan.json")
  [ "$n" -ge 1 ] || fail "plan $attempt ranks no layout"
  for i in $(seq 0 $((n - 1))); do
    flags=$(jq -r ".layouts[$i].train_flags" "$tmp/plan.json")
    echo "plan $attempt, rank $((i + 1)): ndmesh train $flags"
    # shellcheck disable=SC2086
    "${mpirun[@]}" -np 4 "$ndmesh" train $flags "${train_extra[@]}" > "$tmp/run.out" 2> "$tmp/run.err" ||
      fail "the planner ranked a layout ndmesh train refuses ($attempt, rank $((i + 1))): $flags: $(head -c 600 "$tmp/run.err")"
  done
done

# A layout the trainer refuses is never ranked: 8 GPUs with --tp 4 over 2 kv heads.
out=$("$ndmesh" plan "${model[@]}" --gpus 8 --seq 32 --global-batch 8 --tp 4 --top 3 2>&1) && \
  fail "plan ranked tp 4 over 2 kv heads: $out"
echo "$out" | grep -q -- "--tp=4 does not divide --kv-heads=2" || fail "plan --tp 4: message: $out"

# The same names everywhere: --global-batch and --vpp, with --batch and --virtual-stages as aliases.
for name in --global-batch --batch; do
  out=$("$ndmesh" train "$name" 0 2>&1) && fail "train $name 0 ran"
  echo "$out" | grep -q -- "--global-batch=0 must be at least 1" || fail "train $name 0: message: $out"
  "$ndmesh" plan "${model[@]}" --gpus 2 --seq 32 "$name" 4 --top 1 --json > /dev/null || fail "plan $name 4: exit $?"
done
for name in --vpp --virtual-stages; do
  out=$("$ndmesh" train "$name" 0 2>&1) && fail "train $name 0 ran"
  echo "$out" | grep -q -- "--vpp=0 must be at least 1" || fail "train $name 0: message: $out"
  "$ndmesh" plan "${model[@]}" --gpus 2 --seq 32 --global-batch 4 "$name" 2 --top 1 --json > /dev/null ||
    fail "plan $name 2: exit $?"
  "$ndmesh" plan memory "${model[@]}" --pp 2 --seq 32 --schedule interleaved "$name" 2 --global-batch 4 --json \
    > /dev/null || fail "plan memory $name 2: exit $?"
  "$ndmesh" schedule --pp 2 -m 4 --schedule interleaved "$name" 2 --json > /dev/null || fail "schedule $name 2: exit $?"
done
echo "plan_runs.sh: ok"
