#!/usr/bin/env bash
# Predicted (`ndmesh plan`) vs measured (`ndmesh train`) step time and memory per rank for
# the small GPT that `ndmesh train` builds, on this machine.
#
#   bash scripts/plan_vs_train.sh [path/to/ndmesh] [hardware.toml]
#
# Without a hardware file it first runs `ndmesh calibrate` once per rank count of the list
# (same BLAS threads as the training runs). Every layout is trained under mpirun (the
# serial one alone) with --json; its last line gives "layout", "step_seconds" and
# "memory_bytes" {params, grads, optimizer, activations, peak_rss} per rank. The planner
# describes the same model (fp32 AdamW, no dropout, flash attention as the trainer's blockwise kernel, GPT shape), the
# calibration file, and the measured layout fixed by constraints.
#
# Environment: STEPS (default 20), THREADS (BLAS threads per rank, default 1), MODEL (the
# model flags, default the trainer's defaults), BATCH (sequences per step, default 16),
# RECOMPUTE (none, selective or full: given to both ndmesh train and ndmesh plan; default none).
# Needs the parallel `ndmesh train` (--dp, the JSON fields above); until it exists the
# parallel rows print the trainer's error and the serial row has no memory numbers.
set -uo pipefail
ndmesh=${1:-build/bin/ndmesh}
hardware=${2:-}
steps=${STEPS:-20}
threads=${THREADS:-1}
batch=${BATCH:-16}
recompute=${RECOMPUTE:-none}
model=${MODEL:-"--layers 2 --hidden 64 --heads 4 --kv-heads 2 --seq 64 --vocab 32"}
mpirun=(mpirun --allow-run-as-root --oversubscribe)
export NDMESH_THREADS=$threads
command -v jq >/dev/null || { echo "plan_vs_train.sh: needs jq (apt-get install jq)" >&2; exit 2; }

# Layouts: "name|ranks|train flags|plan constraints". Add tp/pp/cp rows here when `ndmesh
# train` runs them, e.g. "tp2|2|--tp 2|--tp 2 --cp 1 --pp 1 --dp 1 --micro-batch $batch".
layouts=(
  "serial|1||--tp 1 --cp 1 --pp 1 --dp 1 --micro-batch $batch"
  "dp2|2|--dp 2|--tp 1 --cp 1 --pp 1 --dp 2 --micro-batch $((batch / 2))"
  "dp4|4|--dp 4|--tp 1 --cp 1 --pp 1 --dp 4 --micro-batch $((batch / 4))"
  "cp2|2|--cp 2|--tp 1 --cp 2 --pp 1 --dp 1 --micro-batch $batch"
  "dp2cp2|4|--dp 2 --cp 2|--tp 1 --cp 2 --pp 1 --dp 2 --micro-batch $((batch / 2))"
)

# Without a file: one calibration per rank count, with that many ranks sharing the machine
# (ranks oversubscribing the cores each get a share of the FLOP/s, as in training).
declare -A calibrated
hardware_for() {  # hardware_for RANKS -> path of the hardware file
  local ranks=$1
  if [ -n "$hardware" ]; then echo "$hardware"; return; fi
  if [ -z "${calibrated[$ranks]:-}" ]; then
    local f
    f=$(mktemp --suffix=.toml)
    echo "calibrating on $ranks rank(s) ($threads BLAS thread(s) each) -> $f" >&2
    if [ "$ranks" -gt 1 ]; then
      "${mpirun[@]}" -np "$ranks" "$ndmesh" calibrate --seconds 10 --threads "$threads" --output "$f" >&2
    else
      "$ndmesh" calibrate --seconds 10 --threads "$threads" --output "$f" >&2
    fi || exit 1
    calibrated[$ranks]=$f
  fi
  echo "${calibrated[$ranks]}"
}
for l in "${layouts[@]}"; do hardware_for "$(echo "$l" | cut -d'|' -f2)" >/dev/null; done

mib() { awk -v b="$1" 'BEGIN { if (b == "" || b == "null") print "-"; else printf "%.2f", b / 1048576 }'; }
ratio() { awk -v p="$1" -v m="$2" 'BEGIN { if (m == "" || m == "null" || m == 0) print "-"; else printf "%.2f", p / m }'; }

printf '%-8s %5s | %9s %9s %6s | %8s %8s | %8s %8s | %8s %8s | %8s %8s | %8s %8s\n' layout ranks \
  "pred s" "meas s" ratio "pred par" "meas par" "pred grd" "meas grd" "pred opt" "meas opt" "pred act" "meas act" \
  "pred tot" "meas rss"
printf '%-8s %5s | %26s | %17s | %17s | %17s | %17s | %17s\n' "" "" "seconds per step" "params MiB/rank" \
  "grads MiB/rank" "optimizer MiB" "activations MiB" "total / peak RSS"
for l in "${layouts[@]}"; do
  IFS='|' read -r name ranks train_flags constraints <<<"$l"
  # shellcheck disable=SC2086
  if [ "$ranks" -gt 1 ]; then
    out=$("${mpirun[@]}" -np "$ranks" "$ndmesh" train $model --batch "$batch" --steps "$steps" --threads "$threads" \
      --recompute "$recompute" $train_flags --json 2>&1)
  else
    out=$("$ndmesh" train $model --batch "$batch" --steps "$steps" --threads "$threads" --recompute "$recompute" \
      $train_flags --json 2>&1)
  fi
  rc=$?
  meas=$(echo "$out" | grep '^{' | tail -1)
  if [ $rc -ne 0 ] || [ -z "$meas" ]; then
    why=$(echo "$out" | grep -m1 'ndmesh:' || echo "$out" | tail -1)
    echo "$name: ndmesh train failed (exit $rc): $why"
    continue
  fi
  # shellcheck disable=SC2086
  pred=$("$ndmesh" plan $model --mlp gelu --no-dropout --precision fp32 --attention flash --hardware "$(hardware_for "$ranks")" \
    --gpus "$ranks" --global-batch "$batch" $constraints --max-zero 0 --recompute "$recompute" --top 1 --json 2>&1)
  if ! echo "$pred" | jq -e '.layouts[0]' >/dev/null 2>&1; then
    echo "$name: ndmesh plan gave no layout: $(echo "$pred" | tail -1)"
    continue
  fi
  p() { echo "$pred" | jq -r ".layouts[0].$1"; }
  m() { echo "$meas" | jq -r ".$1 // empty"; }
  # The measured layout must be the one planned.
  for d in dp pp cp tp; do
    got=$(m "layout.$d"); want=$(p "$d")
    [ -z "$got" ] || [ "$got" = "$want" ] || echo "$name: trainer ran $d=$got but the plan is for $d=$want"
  done
  pt=$(p step_time_s); mt=$(m step_seconds)
  [ -n "$mt" ] || mt=$(echo "$meas" | jq -r 'if .seconds and .steps then .seconds / .steps else empty end')
  printf '%-8s %5s | %9.4f %9s %6s | %8s %8s | %8s %8s | %8s %8s | %8s %8s | %8s %8s\n' "$name" "$ranks" "$pt" \
    "$(awk -v t="$mt" 'BEGIN { if (t == "") print "-"; else printf "%.4f", t }')" "$(ratio "$pt" "$mt")" \
    "$(mib "$(p memory_bytes.params)")" "$(mib "$(m memory_bytes.params)")" \
    "$(mib "$(p memory_bytes.grads)")" "$(mib "$(m memory_bytes.grads)")" \
    "$(mib "$(p memory_bytes.optimizer)")" "$(mib "$(m memory_bytes.optimizer)")" \
    "$(mib "$(p memory_bytes.activations)")" "$(mib "$(m memory_bytes.activations)")" \
    "$(mib "$(p memory_bytes.total)")" "$(mib "$(m memory_bytes.peak_rss)")"
done
for l in "${layouts[@]}"; do
  f=$(hardware_for "$(echo "$l" | cut -d'|' -f2)")
  echo "hardware for $(echo "$l" | cut -d'|' -f1): $f ($(grep '^source' "$f" | cut -d'"' -f2))"
done
echo "model: $model, batch $batch, $steps steps, recompute $recompute, $threads BLAS thread(s) per rank; predicted: ndmesh plan --precision fp32 --no-dropout --attention flash --mlp gelu"
