#!/usr/bin/env bash
# Expert parallelism against the serial run, beyond tests/mpi/train_moe.sh: moe-tiny made small
# (as there), 4 steps, every --ep that divides --dp 2 / 4 / 8, with ZeRO 1, 2 and 3, full
# recompute, both routers, a shared expert and a capacity factor; with --pp 2 under every
# schedule (interleaved: 4 blocks, 2 virtual stages), with ZeRO 2 and 3; and with --cp and --tp
# (also --sequence-parallel, --pp, ZeRO-3; under cp dropless and with a capacity factor),
# ZeRO-3 with the experts sharded over edp 2 under --pp 2 and --cp 2, a checkpoint moving
# between tp/ep/cp layouts and the serial run, and bf16 products (--precision bf16) against the
# serial bf16 run. Prints one comparison line per layout
# (tests/support/compare_runs.sh's bounds) and fails on the first out of bounds.
#   scripts/moe_ep_matrix.sh [ndmesh]   (default build/bin/ndmesh; mpirun as root, oversubscribed)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build/bin/ndmesh}
source "$root/tests/mpi/train_lib.sh" mpirun --allow-run-as-root --oversubscribe "$bin"
export NDMESH_TIMEOUT_S=${NDMESH_TIMEOUT_S:-120}
steps=4
common=(--model moe-tiny --hidden 32 --expert-ffn 32 --seq 16 --markov-vocab 16 --threads 1 --eval-batches 1
  --warmup 1 --batch 16 --micro-batch 2 --steps $steps --json)
for variant in softmax sigmoid; do
  extra=()
  [ "$variant" = sigmoid ] && extra=(--router sigmoid --shared-experts 1 --capacity-factor 1.0 --aux-loss 0.001)
  serial_run "$variant" "${extra[@]}"
  for dp in 2 4 8; do
    for ep in 2 4; do
      [ $((dp % ep)) -eq 0 ] || continue
      layout_run "$variant" $dp "${variant}_dp${dp}_ep${ep}" --dp $dp --ep $ep "${extra[@]}"
      for zero in 1 2 3; do
        layout_run "$variant" $dp "${variant}_dp${dp}_ep${ep}_zero${zero}" --dp $dp --ep $ep --zero $zero "${extra[@]}"
      done
      layout_run "$variant" $dp "${variant}_dp${dp}_ep${ep}_recompute" --dp $dp --ep $ep --recompute full "${extra[@]}"
    done
  done
  for schedule in gpipe 1f1b zb-h1; do
    layout_run "$variant" 4 "${variant}_dp2_ep2_pp2_$schedule" --dp 2 --ep 2 --pp 2 --schedule $schedule "${extra[@]}"
  done
  serial_run "${variant}_l4" --layers 4 "${extra[@]}"
  layout_run "${variant}_l4" 4 "${variant}_l4_dp2_ep2_pp2_interleaved" --layers 4 --dp 2 --ep 2 --pp 2 \
    --schedule interleaved --vpp 2 "${extra[@]}"
  layout_run "${variant}_l4" 8 "${variant}_l4_dp4_ep4_pp2_zero3" --layers 4 --dp 4 --ep 4 --pp 2 --zero 3 "${extra[@]}"
  layout_run "${variant}_l4" 8 "${variant}_l4_dp4_ep2_pp2_zero3" --layers 4 --dp 4 --ep 2 --pp 2 --zero 3 "${extra[@]}"
  layout_run "${variant}_l4" 8 "${variant}_l4_dp4_ep2_pp2_zbh1_zero2" --layers 4 --dp 4 --ep 2 --pp 2 --schedule zb-h1 \
    --zero 2 "${extra[@]}"
done
for variant in softmax_dropless sigmoid_dropless sigmoid_capacity; do
  extra=()
  [ "$variant" = sigmoid_dropless ] && extra=(--router sigmoid --shared-experts 1 --aux-loss 0.001)
  [ "$variant" = sigmoid_capacity ] && extra=(--router sigmoid --shared-experts 1 --aux-loss 0.001 --capacity-factor 1.0)
  serial_run "$variant" "${extra[@]}"
  layout_run "$variant" 2 "${variant}_cp2" --cp 2 "${extra[@]}"
  layout_run "$variant" 4 "${variant}_dp2_cp2_ep4" --dp 2 --cp 2 --ep 4 "${extra[@]}"
  layout_run "$variant" 4 "${variant}_dp2_cp2_ep2" --dp 2 --cp 2 --ep 2 "${extra[@]}"
  layout_run "$variant" 2 "${variant}_tp2" --tp 2 "${extra[@]}"
  layout_run "$variant" 4 "${variant}_dp2_ep2_tp2" --dp 2 --ep 2 --tp 2 "${extra[@]}"
  layout_run "$variant" 4 "${variant}_dp2_ep2_tp2_sp" --dp 2 --ep 2 --tp 2 --sequence-parallel "${extra[@]}"
  layout_run "$variant" 8 "${variant}_dp2_cp2_ep4_tp2" --dp 2 --cp 2 --ep 4 --tp 2 "${extra[@]}"
  layout_run "$variant" 8 "${variant}_dp2_ep2_tp2_pp2" --dp 2 --ep 2 --tp 2 --pp 2 "${extra[@]}"
  layout_run "$variant" 8 "${variant}_dp2_cp2_ep2_pp2" --dp 2 --cp 2 --ep 2 --pp 2 "${extra[@]}"
  layout_run "$variant" 4 "${variant}_dp2_ep2_tp2_zero3" --dp 2 --ep 2 --tp 2 --zero 3 "${extra[@]}"
  layout_run "$variant" 4 "${variant}_dp2_cp2_ep2_zero3" --dp 2 --cp 2 --ep 2 --zero 3 "${extra[@]}"
done
# A checkpoint saved under --dp 2 --ep 2 --tp 2 resumes serially and under --dp 2 --cp 2 --ep 4 --tp 2.
"${mpirun[@]}" -np 4 "$ndmesh" train "${common[@]}" --dp 2 --ep 2 --tp 2 --until 2 --save "$tmp/tp.ckpt" \
  > "$tmp/tp_save.out" 2>&1 || fail "save under --dp 2 --ep 2 --tp 2: $(tail -5 "$tmp/tp_save.out")"
"$ndmesh" train "${common[@]}" --load "$tmp/tp.ckpt" 2> /dev/null | tail -n 1 > "$tmp/tp_r1.json"
expect_same "saved under --dp 2 --ep 2 --tp 2, resumed serially" "$tmp/softmax_dropless.json" "$tmp/tp_r1.json" --from 2
"${mpirun[@]}" -np 8 "$ndmesh" train "${common[@]}" --dp 2 --cp 2 --ep 4 --tp 2 --load "$tmp/tp.ckpt" 2> /dev/null |
  tail -n 1 > "$tmp/tp_r8.json"
expect_same "saved under --dp 2 --ep 2 --tp 2, resumed under --dp 2 --cp 2 --ep 4 --tp 2" "$tmp/softmax_dropless.json" \
  "$tmp/tp_r8.json" --from 2
# Experts ZeRO-3-sharded over edp 2: saved under --dp 4 --ep 2 --zero 3, resumed serially, under
# --dp 2 --ep 2 --zero 2 and under --dp 8 --ep 2 --zero 3 (edp 4: other shards).
"${mpirun[@]}" -np 4 "$ndmesh" train "${common[@]}" --dp 4 --ep 2 --zero 3 --until 2 --save "$tmp/z3.ckpt" \
  > "$tmp/z3_save.out" 2>&1 || fail "save under --dp 4 --ep 2 --zero 3: $(tail -5 "$tmp/z3_save.out")"
"$ndmesh" train "${common[@]}" --load "$tmp/z3.ckpt" 2> /dev/null | tail -n 1 > "$tmp/z3_r1.json"
expect_same "saved under --dp 4 --ep 2 --zero 3, resumed serially" "$tmp/softmax.json" "$tmp/z3_r1.json" --from 2
"${mpirun[@]}" -np 2 "$ndmesh" train "${common[@]}" --dp 2 --ep 2 --zero 2 --load "$tmp/z3.ckpt" 2> /dev/null |
  tail -n 1 > "$tmp/z3_r2.json"
expect_same "saved under --dp 4 --ep 2 --zero 3, resumed under --dp 2 --ep 2 --zero 2" "$tmp/softmax.json" \
  "$tmp/z3_r2.json" --from 2
"${mpirun[@]}" -np 8 "$ndmesh" train "${common[@]}" --dp 8 --ep 2 --zero 3 --load "$tmp/z3.ckpt" 2> /dev/null |
  tail -n 1 > "$tmp/z3_r8.json"
expect_same "saved under --dp 4 --ep 2 --zero 3, resumed under --dp 8 --ep 2 --zero 3" "$tmp/softmax.json" \
  "$tmp/z3_r8.json" --from 2
# Tensor parallelism with a capacity factor (the same drops on every tp rank).
layout_run sigmoid 4 sigmoid_dp2_ep2_tp2 --dp 2 --ep 2 --tp 2 --router sigmoid --shared-experts 1 \
  --capacity-factor 1.0 --aux-loss 0.001
# bf16 products (--precision bf16: the experts' products in bf16, the router in fp32) against
# the serial bf16 run, both routers (the sigmoid one with a shared expert and a capacity).
for variant in bf16 bf16_sigmoid; do
  extra=(--precision bf16)
  [ "$variant" = bf16_sigmoid ] && extra+=(--router sigmoid --shared-experts 1 --capacity-factor 1.0 --aux-loss 0.001)
  serial_run "$variant" "${extra[@]}"
  layout_run "$variant" 2 "${variant}_dp2_ep2" --dp 2 --ep 2 "${extra[@]}"
  layout_run "$variant" 4 "${variant}_dp4_ep4" --dp 4 --ep 4 "${extra[@]}"
  layout_run "$variant" 4 "${variant}_dp2_ep2_tp2" --dp 2 --ep 2 --tp 2 "${extra[@]}"
  layout_run "$variant" 4 "${variant}_dp2_ep2_pp2" --dp 2 --ep 2 --pp 2 "${extra[@]}"
  layout_run "$variant" 4 "${variant}_dp2_ep2_pp2_zbh1" --dp 2 --ep 2 --pp 2 --schedule zb-h1 "${extra[@]}"
  layout_run "$variant" 2 "${variant}_dp2_ep2_zero3" --dp 2 --ep 2 --zero 3 "${extra[@]}"
  layout_run "$variant" 2 "${variant}_dp2_ep2_recompute" --dp 2 --ep 2 --recompute full "${extra[@]}"
done
serial_run bf16_dropless --precision bf16
layout_run bf16_dropless 4 bf16_dropless_dp2_cp2_ep4 --dp 2 --cp 2 --ep 4 --precision bf16
layout_run bf16_dropless 4 bf16_dropless_dp2_ep2_tp2_sp --dp 2 --ep 2 --tp 2 --sequence-parallel --precision bf16
echo "moe_ep_matrix.sh: ok"
