#!/usr/bin/env bash
# bf16 mixed precision against fp32 on the CPU, the models of scripts/gpu_check.sh's bf16
# step: the default model and a 6-layer 384-wide one (6 heads; --lr 1e-3, where its fp32
# warmup has no loss spikes, docs/train.md), 300 steps each, seed 11.
# Prints, per model, gpu_check_compare.py's bf16 line (every step's loss within 1% and the
# step-1 gradient norm within 2% of fp32's; the step of the largest difference and the
# 25-step means, to read a failure by) and each run's wall time; exits 1 when a bound is
# broken. The default model's comparison runs in ctest too (tests/cli/train_bf16.sh); the
# 384-wide one takes minutes per run on two cores, so it lives here.
#   scripts/bf16_tracking.sh [path to ndmesh] [threads] [folder to keep the runs in]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
ndmesh=${1:-build/bin/ndmesh}
threads=${2:-2}
if [ -n "${3:-}" ]; then
  out=$3
  mkdir -p "$out"
else
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi

models=("default:" "wide:--layers 6 --hidden 384 --heads 6 --lr 1e-3")
run=(train --steps 300 --seed 11 --eval-batches 0 --threads "$threads" --json)
status=0
declare -A seconds
for entry in "${models[@]}"; do
  name=${entry%%:*}
  read -r -a shape <<< "${entry#*:}"
  for p in fp32 bf16; do
    start=$(date +%s.%N)
    "$ndmesh" "${run[@]}" "${shape[@]}" --precision $p > "$out/$name.$p.out"
    seconds[$p]=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b - a}')
    tail -n 1 "$out/$name.$p.out" > "$out/$name.$p.json"
  done
  line=$(python3 "$here/gpu_check_compare.py" bf16 "$out/$name.fp32.json" "$out/$name.bf16.json" \
    "$out/$name.fp32.json" "$out/$name.bf16.json" | sed 's/; [^;]*\.bf16\.json: .*//') || status=1
  echo "$name model (${entry#*:}): $line; wall time fp32 ${seconds[fp32]} s, bf16 ${seconds[bf16]} s"
done
exit $status
