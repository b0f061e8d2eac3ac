#!/usr/bin/env bash
# bf16 mixed precision against fp32 on the CPU, the models of scripts/gpu_check.sh's bf16
# step: the default model and a 6-layer 384-wide one (6 heads), 300 steps each, seed 11.
# Prints, per model, the largest relative difference of the per-step losses and of the
# step-1 gradient norm (bounds: 1% and 2%) and each run's wall time; exits 1 when a bound
# is broken. The default model's comparison runs in ctest too (tests/cli/train_bf16.sh);
# the 384-wide one takes minutes per run on two cores, so it lives here.
#   scripts/bf16_tracking.sh [path to ndmesh] [threads]
set -euo pipefail
ndmesh=${1:-build/bin/ndmesh}
threads=${2:-2}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

models=("default:" "wide:--layers 6 --hidden 384 --heads 6")
run=(train --steps 300 --seed 11 --eval-batches 0 --threads "$threads" --json)
status=0
declare -A seconds
for entry in "${models[@]}"; do
  name=${entry%%:*}
  read -r -a shape <<< "${entry#*:}"
  for p in fp32 bf16; do
    start=$(date +%s.%N)
    "$ndmesh" "${run[@]}" "${shape[@]}" --precision $p > "$tmp/$name.$p.out"
    seconds[$p]=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{print b - a}')
    tail -n 1 "$tmp/$name.$p.out" > "$tmp/$name.$p.json"
  done
  read -r loss norm1 < <(jq -r -n --slurpfile a "$tmp/$name.fp32.json" --slurpfile b "$tmp/$name.bf16.json" '
    def rel: (.[0] - .[1]) / .[0] | if . < 0 then -. else . end;
    "\([$a[0].losses, $b[0].losses] | transpose | map(rel) | max) \([$a[0].grad_norms[0], $b[0].grad_norms[0]] | rel)"')
  printf '%s model (%s): 300 steps, losses within %.3g (bound 0.01), step-1 gradient norm %.3g (bound 0.02); ' \
    "$name" "${entry#*:}" "$loss" "$norm1"
  printf 'final loss fp32 %s bf16 %s; wall time fp32 %.1f s, bf16 %.1f s\n' "$(jq .final_loss "$tmp/$name.fp32.json")" \
    "$(jq .final_loss "$tmp/$name.bf16.json")" "${seconds[fp32]}" "${seconds[bf16]}"
  awk -v l="$loss" -v g="$norm1" 'BEGIN{exit !(l < 0.01 && g < 0.02)}' || { echo "FAIL: $name out of bounds"; status=1; }
done
exit $status
