#!/usr/bin/env bash
# The composition matrix of dp x pp x cp x tp: every layout of at most 16 ranks (sizes
# 1, 2, 4, 8, 16) that the test model accepts, with and without --sequence-parallel when
# tp > 1, plus every --order of 2x2x2x2 that `ndmesh mesh` accepts, trains N steps (default
# 50) under mpirun and is compared with the serial run of the same binary and flags minus
# the layout. Prints one row per layout: the maximum over the steps of |loss - serial| /
# serial, pass/fail at 1e-4 and 1e-5, the relative difference of the step-1 gradient norm
# (same weights: bound 1e-5) and the largest of the later gradient norms (bound 1e-4, as in
# tests/mpi/train_lib.sh), a verdict on all three (losses at 1e-5), and the wall time;
# refused layouts print the reason.
# Model: 4 blocks, hidden 32, 4 heads / 2 key-value heads (so tp <= 2), seq 16 (zigzag cp
# <= 8), batch 16; pp > 1 runs 1f1b with 2 x pp micro-batches per dp rank where possible;
# dp > 1 with pp > 1 also runs with ZeRO (1 without tp, 2 with tp and sequence parallelism);
# every layout with dp > 1 also runs with ZeRO-3 (fully sharded parameters; with sequence
# parallelism when tp > 1).
#   scripts/matrix_4d.sh [path/to/ndmesh] [steps]
# Environment: MPIRUN (default: mpirun --allow-run-as-root --oversubscribe), MAX_RANKS
# (default 16), ONLY (an extended regex the row name must match, e.g. '^dp2_pp2'),
# NO_ORDERS=1 (skip the 2x2x2x2 orders), ARCH=llama (the same matrix on a Llama: RMSNorm,
# SwiGLU of width 64, rotary positions, no biases, untied head; rows named llama_...).
set -uo pipefail
ndmesh=${1:-build/bin/ndmesh}
steps=${2:-50}
read -r -a mpirun <<< "${MPIRUN:-mpirun --allow-run-as-root --oversubscribe}"
max_ranks=${MAX_RANKS:-16}
only=${ONLY:-.}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export NDMESH_TIMEOUT_S=${NDMESH_TIMEOUT_S:-120}

common=(--layers 4 --hidden 32 --heads 4 --kv-heads 2 --seq 16 --markov-vocab 16 --threads 1
  --eval-batches 1 --warmup 2 --batch 16 --steps "$steps" --json)
arch=${ARCH:-gpt2}
prefix=
case $arch in
  gpt2) ;;
  llama) common+=(--arch llama --ffn 64) prefix=llama_ ;;
  *) echo "matrix_4d.sh: ARCH=$arch: use gpt2 or llama" >&2; exit 2 ;;
esac
batch=16

fail() { echo "$*" >&2; exit 1; }
source "$(dirname "$0")/../tests/support/compare_runs.sh"
"$ndmesh" train "${common[@]}" | tail -n 1 > "$tmp/serial.json" || fail "serial run failed"
expect_numbers "serial run" "$tmp/serial.json" "$steps"

# diffs <run.json>: "losses step-1-norm later-norms", the largest relative differences.
diffs() { run_diffs "$tmp/serial.json" "$1" 0; }

printf '%-34s %-12s %5s %-24s %7s %7s %-10s %-10s %7s %7s\n' layout order ranks max_rel_diff 1e-4 1e-5 grad1 grads \
  norms seconds
n_pass5=0 n_pass4=0 n_fail=0 n_refused=0
run() {  # run <name> <order> <flags...>
  local name=$prefix$1 order=$2
  shift 2
  [[ $name =~ $only ]] || return 0
  local dp=1 pp=1 cp=1 tp=1 a=("$@") i
  for ((i = 0; i < ${#a[@]}; i++)); do
    case ${a[i]} in --dp) dp=${a[i + 1]} ;; --pp) pp=${a[i + 1]} ;; --cp) cp=${a[i + 1]} ;; --tp) tp=${a[i + 1]} ;; esac
  done
  local np=$((dp * pp * cp * tp))
  local t0 t1 rc
  t0=$(date +%s.%N)
  "${mpirun[@]}" -np "$np" "$ndmesh" train "${common[@]}" "$@" --order "$order" > "$tmp/out" 2> "$tmp/err"
  rc=$?
  t1=$(date +%s.%N)
  local secs
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b - a}')
  if [ "$rc" -eq 2 ]; then
    n_refused=$((n_refused + 1))
    printf '%-34s %-12s %5s refused: %s\n' "$name" "$order" "$np" \
      "$(grep -m1 -o '\[train\].*\|--[a-z-]*:.*' "$tmp/err" | cut -c1-160)"
    return 0
  fi
  if [ "$rc" -ne 0 ] || ! tail -n 1 "$tmp/out" > "$tmp/run.json" ||
    ! jq -e --argjson n "$steps" '.losses | length == $n' "$tmp/run.json" > /dev/null 2>&1; then
    n_fail=$((n_fail + 1))
    printf '%-34s %-12s %5s %-24s %7s %7s %-10s %-10s %7s %7s\n' "$name" "$order" "$np" "crash(rc=$rc)" FAIL FAIL - - \
      FAIL "$secs"
    grep -v '^\s*$' "$tmp/err" | head -n 3 | sed 's/^/    /'
    return 0
  fi
  local d g1 g p4 p5 pn
  read -r d g1 g <<< "$(diffs "$tmp/run.json")"
  [[ $d =~ ^[0-9] && $g1 =~ ^[0-9] && $g =~ ^[0-9] ]] || d=nan g1=nan g=nan  # no numbers: every verdict FAIL
  p4=$(awk -v d="$d" 'BEGIN{print (d < 1e-4) ? "pass" : "FAIL"}')
  p5=$(awk -v d="$d" 'BEGIN{print (d < 1e-5) ? "pass" : "FAIL"}')
  pn=$(awk -v a="$g1" -v b="$g" 'BEGIN{print (a < 1e-5 && b < 1e-4) ? "pass" : "FAIL"}')
  [ "$p5" = pass ] && [ "$pn" = pass ] && n_pass5=$((n_pass5 + 1))
  [ "$p4" = pass ] && [ "$pn" = pass ] && n_pass4=$((n_pass4 + 1))
  { [ "$p4" = FAIL ] || [ "$pn" = FAIL ]; } && n_fail=$((n_fail + 1))
  printf '%-34s %-12s %5s %-24s %7s %7s %-10.3g %-10.3g %7s %7s\n' "$name" "$order" "$np" "$d" "$p4" "$p5" "$g1" "$g" \
    "$pn" "$secs"
}

for tp in 1 2; do
  for pp in 1 2 4; do
    for cp in 1 2 4 8; do
      for dp in 1 2 4 8 16; do
        np=$((dp * pp * cp * tp))
        [ "$np" -le "$max_ranks" ] && [ "$np" -gt 1 ] || continue
        flags=(--dp "$dp" --pp "$pp" --cp "$cp" --tp "$tp")
        name="dp${dp}_pp${pp}_cp${cp}_tp${tp}"
        if [ "$pp" -gt 1 ]; then
          mb=$((batch / dp / (2 * pp)))
          [ "$mb" -ge 1 ] || mb=1
          flags+=(--micro-batch "$mb")
          name+="_mb$mb"
        fi
        run "$name" dp,pp,cp,tp "${flags[@]}"
        [ "$tp" -gt 1 ] && run "${name}_sp" dp,pp,cp,tp "${flags[@]}" --sequence-parallel
        # ZeRO-3 on every layout with dp > 1.
        if [ "$dp" -gt 1 ]; then
          if [ "$tp" -gt 1 ]; then
            run "${name}_sp_zero3" dp,pp,cp,tp "${flags[@]}" --sequence-parallel --zero 3
          else
            run "${name}_zero3" dp,pp,cp,tp "${flags[@]}" --zero 3
          fi
        fi
        # ZeRO under pipelines: stage 1 without tp, stage 2 with sequence parallelism.
        if [ "$dp" -gt 1 ] && [ "$pp" -gt 1 ]; then
          if [ "$tp" -gt 1 ]; then
            run "${name}_sp_zero2" dp,pp,cp,tp "${flags[@]}" --sequence-parallel --zero 2
          else
            run "${name}_zero1" dp,pp,cp,tp "${flags[@]}" --zero 1
          fi
        fi
      done
    done
  done
done

if [ "${NO_ORDERS:-0}" != 1 ] && [ "$max_ranks" -ge 16 ]; then
  for order in $(python3 -c "import itertools; print(' '.join(','.join(p) for p in itertools.permutations(['dp','pp','cp','tp'])))"); do
    if ! "$ndmesh" mesh --dp 2 --pp 2 --cp 2 --tp 2 --order "$order" > /dev/null 2>&1; then
      printf '%-34s %-12s %5s refused by ndmesh mesh\n' dp2_pp2_cp2_tp2_sp_mb2 "$order" 16
      continue
    fi
    run dp2_pp2_cp2_tp2_sp_mb2_order "$order" --dp 2 --pp 2 --cp 2 --tp 2 --micro-batch 2 --sequence-parallel
  done
fi
echo "summary: $n_pass5 pass at 1e-5, $n_pass4 pass at 1e-4, $n_fail fail or crash, $n_refused refused"
