#!/usr/bin/env bash
# Tensor-parallel training with real processes: tp 1, 2 and 4 with and without sequence
# parallelism, tied and untied heads, grouped-query attention, micro-batches, and dp 2 x
# tp 2 in both orders with ZeRO, cp 2 x tp 2: the losses of 20 steps equal the serial run's (the same
# binary, the same flags without the layout) within 1e-5 relative. Also: the per-rank
# parameter count is serial / tp apart from the replicated norms, biases and positions;
# one step's tp communication equals its closed form (calls and bytes per collective);
# a checkpoint saved under tp 2 continues under tp 4 and serially with the uninterrupted
# run's losses; bad layouts fail with the flag, the value and the fix.
#   train_tp.sh <mpirun command...> <path to ndmesh>
source "$(dirname "$0")/train_lib.sh" "$@"

steps=20
common=(--layers 2 --hidden 32 --markov-vocab 16 --threads 1 --eval-batches 1 --warmup 2 --batch 12
  --steps "$steps" --json)
gqa=(--seq 16 --heads 4 --kv-heads 2)  # tp 1, 2: two query heads per key/value head
wide=(--seq 16 --heads 8 --kv-heads 4) # tp 4: 2 query heads and 1 key/value head per rank

serial_run gqa "${gqa[@]}"
serial_run gqa_untied "${gqa[@]}" --untied
serial_run wide "${wide[@]}"
serial_run wide_untied "${wide[@]}" --untied


layout_run gqa 1 tp1 "${gqa[@]}" --tp 1
layout_run gqa 2 tp2 "${gqa[@]}" --tp 2
layout_run gqa 2 tp2_sp "${gqa[@]}" --tp 2 --sequence-parallel
layout_run gqa_untied 2 tp2_untied "${gqa[@]}" --untied --tp 2
layout_run gqa_untied 2 tp2_sp_untied "${gqa[@]}" --untied --tp 2 --sequence-parallel
layout_run gqa 2 tp2_sp_micro "${gqa[@]}" --tp 2 --sequence-parallel --micro-batch 4
layout_run wide 4 tp4 "${wide[@]}" --tp 4
layout_run wide 4 tp4_sp "${wide[@]}" --tp 4 --sequence-parallel
layout_run wide_untied 4 tp4_sp_untied "${wide[@]}" --untied --tp 4 --sequence-parallel
layout_run gqa 4 dp2_tp2 "${gqa[@]}" --dp 2 --tp 2
layout_run gqa 4 dp2_tp2_sp "${gqa[@]}" --dp 2 --tp 2 --sequence-parallel
layout_run gqa 4 dp2_tp2_sp_zero1 "${gqa[@]}" --dp 2 --tp 2 --sequence-parallel --zero 1 --bucket-mb 0.01
layout_run gqa 4 cp2_tp2_sp "${gqa[@]}" --cp 2 --tp 2 --sequence-parallel
layout_run gqa_untied 4 tp2_dp2_order_zero2 "${gqa[@]}" --untied --dp 2 --tp 2 --order tp,dp --zero 2 --micro-batch 3
# Composed with pipeline parallelism: stage boundaries carry this rank's rows under sequence
# parallelism; the tp-summed gradients are summed once per step after the dp reduction (also
# with zero-bubble's split backward); a tied head's token table shard is summed over the
# embedding group.
layout_run gqa 4 pp2_tp2_sp "${gqa[@]}" --pp 2 --tp 2 --sequence-parallel --micro-batch 3
layout_run gqa_untied 4 pp2_tp2_sp_zbh1 "${gqa[@]}" --untied --pp 2 --tp 2 --sequence-parallel --schedule zb-h1 --micro-batch 2

# Parameters: the logical count is the serial one; a rank holds 1/tp of every split
# matrix and bias and all of the replicated norms, row-parallel biases and positions.
# L blocks of C, heads H/KV of hd, ffn F, vocab V (stored padded to P = 64 rows), seq S.
per_rank() {  # per_rank <json> <H> <KV> <untied 0/1> <tp>
  local L=2 C=32 F=128 V=16 P=64 S=16 H=$2 KV=$3 u=$4 tp=$5
  local hd=$((C / H))
  local R=$(((H + 2 * KV) * hd))
  local blocks=$((L * (C * R + R + C * H * hd + C * F + F + F * C)))
  local split=$((blocks + V * C + u * V * C)) stored=$((blocks + P * C + u * P * C))
  local repl=$((L * (2 * C + C + 2 * C + C) + S * C + 2 * C))
  jq -e --argjson s "$split" --argjson st "$stored" --argjson r "$repl" --argjson tp "$tp" \
    '.parameters == $s + $r and .parameters_per_rank == $st / $tp + $r' "$1" > /dev/null ||
    fail "$1: parameters $(jq -c '[.parameters, .parameters_per_rank]' "$1"), expected $((split + repl)) and $((stored / tp + repl))"
}
per_rank "$tmp/gqa.json" 4 2 0 1
per_rank "$tmp/tp2.json" 4 2 0 2
per_rank "$tmp/tp2_untied.json" 4 2 1 2
per_rank "$tmp/tp4_sp_untied.json" 8 4 1 4

# Communication of one step over the tp group (bytes of the full buffers, fp32), N token
# rows per micro-batch (batch / dp * seq), M micro-batches, L blocks, C channels:
#  without sequence parallelism: all-reduce of N C for the embedding, 2 per block forward
#    (after each row-parallel linear), 1 for the head backward and 2 per block backward
#    (before each column-parallel linear), per micro-batch; the cross-entropy's maxima (N)
#    and sums (2 N) per micro-batch (the gradient norm is one all-reduce over the world, not
#    over tp).
#  with it: those N C all-reduces become all-gathers (block forward 2, final norm 1, block
#    backward 2, embedding backward 1) and reduce-scatters (embedding 1, block forward 2,
#    block backward 2, head backward 1) of N C each; the gathered norm outputs are not kept
#    but gathered again in the backward (2 per block, 1 for the final norm); plus, once per
#    step after the dp reduction, one all-reduce of the gradients replicated over tp (6 C
#    norm and row-parallel bias elements per block, 2 C of the final norm; GradSync).
comm_check() {  # comm_check <json> <N> <M> <sp 0/1>
  local f=$1 N=$2 M=$3 sp=$4 L=2 C=32
  local ar_calls ar_bytes ag_calls ag_bytes rs_calls rs_bytes
  if [ "$sp" -eq 0 ]; then
    ar_calls=$((M * (4 * L + 4)))
    ar_bytes=$((M * ((4 * L + 2) * N * C * 4 + 3 * N * 4)))
    ag_calls=0
    ag_bytes=0
    rs_calls=0
    rs_bytes=0
  else
    ar_calls=$((M * 2 + 1))
    ar_bytes=$((M * 3 * N * 4 + (L * 6 * C + 2 * C) * 4))
    ag_calls=$((M * (6 * L + 3)))
    ag_bytes=$((M * (6 * L + 3) * N * C * 4))
    rs_calls=$((M * (4 * L + 2)))
    rs_bytes=$((M * (4 * L + 2) * N * C * 4))
  fi
  jq -e --argjson arc "$ar_calls" --argjson arb "$ar_bytes" --argjson agc "$ag_calls" --argjson agb "$ag_bytes" \
    --argjson rsc "$rs_calls" --argjson rsb "$rs_bytes" \
    '.tp_comm_per_step == {"all_reduce": {"calls": $arc, "bytes": $arb}, "all_gather": {"calls": $agc, "bytes": $agb},
      "reduce_scatter": {"calls": $rsc, "bytes": $rsb}}' "$f" > /dev/null ||
    fail "$f: tp communication $(jq -c .tp_comm_per_step "$f"), expected all-reduce $ar_calls calls $ar_bytes bytes, all-gather $ag_calls calls $ag_bytes bytes, reduce-scatter $rs_calls calls $rs_bytes bytes"
  echo "$(basename "$f" .json): tp communication per step $(jq -c .tp_comm_per_step "$f") = closed form"
}
comm_check "$tmp/tp2.json" 192 1 0
comm_check "$tmp/tp2_sp.json" 192 1 1
comm_check "$tmp/tp2_sp_micro.json" 64 3 1
comm_check "$tmp/tp4_sp.json" 192 1 1
comm_check "$tmp/dp2_tp2.json" 96 1 0
comm_check "$tmp/dp2_tp2_sp.json" 96 1 1
jq -e '.tp_comm_per_step.all_reduce.calls == 0' "$tmp/tp1.json" > /dev/null || fail "tp 1 communicates over tp"

# Checkpoints hold the logical model: saved under dp 2 x tp 2 with sequence parallelism
# and ZeRO at step 10, continued under tp 4, tp 1 and serially: steps 11..20 as uninterrupted.
"${mpirun[@]}" -np 4 "$ndmesh" train "${common[@]}" "${wide[@]}" --dp 2 --tp 2 --sequence-parallel --zero 1 \
  --until 10 --save "$tmp/ck.bin" > /dev/null || fail "save under dp 2 x tp 2"
for layout in "4 --tp 4 --sequence-parallel" "2 --tp 2" "1 --tp 1"; do
  set -- $layout
  np=$1
  shift
  "${mpirun[@]}" -np "$np" "$ndmesh" train "${common[@]}" "${wide[@]}" "$@" --load "$tmp/ck.bin" | tail -n 1 \
    > "$tmp/resumed.json" || fail "load under $layout"
  expect_same "saved under dp 2 x tp 2, resumed under $layout" "$tmp/wide.json" "$tmp/resumed.json" --from 10
done

# Bad layouts: exit 2 with the flag, the value and the fix, at once.
expect_usage() {  # expect_usage <needle> <ranks> <flags...>
  local needle=$1 np=$2
  shift 2
  expect_train_usage "$needle" "$np" "${common[@]}" "$@"
}
expect_usage "--tp=4 does not divide --kv-heads=2" 4 "${gqa[@]}" --tp 4
expect_usage "--tp=3 does not divide --heads=4" 3 "${gqa[@]}" --tp 3
expect_usage "--sequence-parallel needs --tp > 1" 1 "${gqa[@]}" --sequence-parallel
expect_usage "token rows of a micro-batch (micro-batch x --seq / --cp) are not divisible by 4" 4 --heads 8 --kv-heads 4 \
  --tp 4 --sequence-parallel --seq 15 --micro-batch 1
echo "train_tp.sh: ok"
