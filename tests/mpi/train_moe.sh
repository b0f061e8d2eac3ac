#!/usr/bin/env bash
# A mixture of experts data-parallel, with real processes: moe-tiny's shape made small
# (2 blocks of hidden 32, 4 SwiGLU experts top-2 of width 32, seq 16) trains 4 steps serially
# and under --dp 2, and their losses and gradient norms must be equal within compare_runs.sh's
# bounds, as must the auxiliary losses; the same with a sigmoid router, a shared expert and a
# capacity factor, also under ZeRO 2 (the drops and the bias updates of the serial run: the
# loads are summed over the ranks before the bias moves). The auxiliary loss and the capacity are per micro-batch, so
# every run has micro-batches of 2 sequences (serial: 4 of them; dp 2: 2 per rank), the same
# ones. A capacity factor with --cp is refused in one line.
# Expert parallelism (--ep, folded into dp): --dp 2 --ep 2, --dp 4 --ep 2 and --dp 4 --ep 4
# equal the serial run (routing, loads and drops too: --dp 2 --ep 2 with the capacity
# factor), as do --dp 2 --ep 2 with --pp 2 (1f1b; zb-h1 with the sigmoid router), with
# --zero 3 and with --tp 2, --dp 4 --ep 2 --zero 3 (experts ZeRO-3 over edp 2) and --dp 2
# --cp 2 --ep 4 (scripts/moe_ep_matrix.sh runs every schedule and more); a checkpoint saved at step 2 under --dp 2 --ep 2 resumes under --dp 4 --ep 4 and
# serially, equal to the serial run's steps 3-4. Under --ep N a rank stores only its experts
# (checked from the JSON's parameter counts and bytes).
#   train_moe.sh <mpirun command...> <path to ndmesh>
source "$(dirname "$0")/train_lib.sh" "$@"

steps=4
common=(--model moe-tiny --hidden 32 --expert-ffn 32 --seq 16 --markov-vocab 16 --threads 1 --eval-batches 1
  --warmup 1 --batch 8 --micro-batch 2 --steps $steps --json)

aux_same() {  # aux_same <a> <b>: the auxiliary losses within 1e-5 relative
  jq -e -n --slurpfile a "$tmp/$1.json" --slurpfile b "$tmp/$2.json" \
    '[range($a[0].aux_losses | length) as $i | (($a[0].aux_losses[$i] - $b[0].aux_losses[$i]) | fabs) /
      ($a[0].aux_losses[$i] | fabs)] | all(. <= 1e-5)' > /dev/null ||
    fail "$2's auxiliary losses $(jq -c .aux_losses "$tmp/$2.json") differ from $1's $(jq -c .aux_losses "$tmp/$1.json")"
  jq -e -n --slurpfile a "$tmp/$1.json" --slurpfile b "$tmp/$2.json" '$a[0].expert_loads == $b[0].expert_loads' \
    > /dev/null || fail "$2's expert loads differ from $1's"
}

serial_run moe
layout_run moe 2 moe_dp2 --dp 2
aux_same moe moe_dp2

extra=(--router sigmoid --shared-experts 1 --capacity-factor 1.0 --aux-loss 0.001)
serial_run sig "${extra[@]}"
layout_run sig 2 sig_dp2 --dp 2 "${extra[@]}"
aux_same sig sig_dp2
layout_run sig 2 sig_dp2_zero2 --dp 2 --zero 2 "${extra[@]}"
aux_same sig sig_dp2_zero2

layout_run moe 2 moe_dp2_ep2 --dp 2 --ep 2
aux_same moe moe_dp2_ep2
# ep_comm_per_step, rank 0's last step: 2 MoE blocks x 2 micro-batches x 6 exchanges (counts,
# rows, outputs; backward the same); it sent its S = 2 x 2 x 32 tokens x top-2 rows as [x]
# (C = 32) and [x, dout, weight] (2C+1), and sent back [y] (C) and [dx, d weight] (C+1) for the
# R rows of its experts 0-1 (the step's loads of experts 0-1 of each block); fp32 bytes.
jq -e '.ep_comm_per_step.calls == 0' "$tmp/moe.json" > /dev/null || fail "serial ep_comm_per_step: $(jq -c .ep_comm_per_step "$tmp/moe.json")"
jq -e '(.expert_loads[-1] | .[0] + .[1] + .[4] + .[5]) as $r | .ep_comm_per_step.calls == 24 and
  .ep_comm_per_step.bytes == 4 * (256 * (3 * 32 + 1) + $r * (2 * 32 + 1))' "$tmp/moe_dp2_ep2.json" > /dev/null ||
  fail "ep_comm_per_step $(jq -c .ep_comm_per_step "$tmp/moe_dp2_ep2.json") for loads $(jq -c '.expert_loads[-1]' "$tmp/moe_dp2_ep2.json")"
layout_run moe 4 moe_dp4_ep2 --dp 4 --ep 2
aux_same moe moe_dp4_ep2
layout_run moe 4 moe_dp4_ep4 --dp 4 --ep 4
aux_same moe moe_dp4_ep4
# Sharded expert storage: under --ep N a rank stores 4/N of each MoE block's 4 experts, so it holds
# the serial run's parameters less 2 blocks x (4 - 4/N) experts x (fc [2*32, 32] + proj [32, 32]
# = 3072), and their bytes less in memory_bytes.params (fp32, no padding at ZeRO 0); the logical
# count (parameters) stays the serial one.
stores() {  # stores <run> <experts not stored per block>
  jq -e -n --slurpfile a "$tmp/moe.json" --slurpfile b "$tmp/$1.json" --argjson gone "$((2 * $2 * 3072))" \
    '$b[0].parameters == $a[0].parameters and $b[0].parameters_per_rank == $a[0].parameters_per_rank - $gone and
     $b[0].memory_bytes.params == $a[0].memory_bytes.params - 4 * $gone' > /dev/null ||
    fail "$1 stores $(jq -c '[.parameters, .parameters_per_rank, .memory_bytes.params]' "$tmp/$1.json"), serial $(jq -c \
      '[.parameters, .parameters_per_rank, .memory_bytes.params]' "$tmp/moe.json"): not $2 experts per block fewer"
}
stores moe_dp2_ep2 2
stores moe_dp4_ep2 2
stores moe_dp4_ep4 3
layout_run sig 2 sig_dp2_ep2 --dp 2 --ep 2 "${extra[@]}"
aux_same sig sig_dp2_ep2

# Pipeline parallelism (the expert groups inside a stage's dp ranks; the stages' loads summed at
# their blocks' places) and ZeRO-3 (expert parameters gathered with their block).
layout_run moe 4 moe_dp2_ep2_pp2 --dp 2 --ep 2 --pp 2
aux_same moe moe_dp2_ep2_pp2
layout_run sig 4 sig_dp2_ep2_pp2_zbh1 --dp 2 --ep 2 --pp 2 --schedule zb-h1 "${extra[@]}"
aux_same sig sig_dp2_ep2_pp2_zbh1
layout_run moe 2 moe_dp2_ep2_zero3 --dp 2 --ep 2 --zero 3
aux_same moe moe_dp2_ep2_zero3
# ZeRO-3 over an edp group of one: the dense parameters' shard and the rank's experts whole (2 of 4).
jq -e -n --slurpfile a "$tmp/moe.json" --slurpfile b "$tmp/moe_dp2_ep2_zero3.json" \
  '$b[0].parameters_per_rank == $a[0].parameters_per_rank - 2 * 2 * 3072' > /dev/null ||
  fail "--zero 3 --ep 2 stores $(jq .parameters_per_rank "$tmp/moe_dp2_ep2_zero3.json") parameters"
# --dp 4 --ep 2 --zero 3 (edp 2): a MoE block's 2 stored experts are sharded over their edp group
# and gathered with the block, so a rank keeps a quarter of everything resident (the dense units'
# shard over dp 4, half of its 2 experts per block): its parameter bytes less what it gathered are
# the serial run's over 4 (no padding: every unit and expert range splits evenly).
layout_run moe 4 moe_dp4_ep2_zero3 --dp 4 --ep 2 --zero 3
aux_same moe moe_dp4_ep2_zero3
jq -e -n --slurpfile a "$tmp/moe.json" --slurpfile b "$tmp/moe_dp4_ep2_zero3.json" \
  '$b[0].memory_bytes.params - $b[0].memory_bytes.params_gathered == $a[0].memory_bytes.params / 4' > /dev/null ||
  fail "--dp 4 --ep 2 --zero 3 keeps $(jq -c '.memory_bytes | [.params, .params_gathered]' \
    "$tmp/moe_dp4_ep2_zero3.json") parameter bytes (resident, gathered), serial $(jq .memory_bytes.params "$tmp/moe.json")"
# Context parallelism (a micro-batch's tokens on 2 ranks: the auxiliary loss sums their counts)
# with the expert group across dp and cp; tensor parallelism (each expert split over tp).
layout_run moe 4 moe_dp2_cp2_ep4 --dp 2 --cp 2 --ep 4
aux_same moe moe_dp2_cp2_ep4
# A capacity under cp (1.0 drops assignments here: the losses differ from the dropless run's):
# the drop rule orders the whole micro-batch's tokens, whose halves are on the two cp ranks
# (zigzag chunks), so the same assignments are dropped as in the serial run.
layout_run sig 4 sig_dp2_cp2_ep2 --dp 2 --cp 2 --ep 2 "${extra[@]}"
aux_same sig sig_dp2_cp2_ep2
layout_run moe 4 moe_dp2_ep2_tp2 --dp 2 --ep 2 --tp 2
aux_same moe moe_dp2_ep2_tp2

# One checkpoint, written under --dp 2 --ep 2, resumed under --dp 4 --ep 4 and serially.
"${mpirun[@]}" -np 2 "$ndmesh" train "${common[@]}" --dp 2 --ep 2 --until 2 --save "$tmp/ep.ckpt" > "$tmp/save.out" 2>&1 ||
  fail "save under --dp 2 --ep 2: $(tail -5 "$tmp/save.out")"
"${mpirun[@]}" -np 4 "$ndmesh" train "${common[@]}" --dp 4 --ep 4 --load "$tmp/ep.ckpt" 2> "$tmp/r4.err" | tail -n 1 \
  > "$tmp/resumed4.json" || fail "load under --dp 4 --ep 4: $(tail -5 "$tmp/r4.err")"
expect_same "saved under --dp 2 --ep 2, resumed under --dp 4 --ep 4" "$tmp/moe.json" "$tmp/resumed4.json" --from 2
"$ndmesh" train "${common[@]}" --load "$tmp/ep.ckpt" 2> "$tmp/r1.err" | tail -n 1 > "$tmp/resumed1.json" ||
  fail "serial load: $(tail -5 "$tmp/r1.err")"
expect_same "saved under --dp 2 --ep 2, resumed serially" "$tmp/moe.json" "$tmp/resumed1.json" --from 2

expect_train_usage "ep=4 must divide dp*cp" 2 "${common[@]}" --dp 2 --ep 4
expect_train_usage "--ep=2 needs a mixture of experts" 2 --hidden 32 --seq 16 --markov-vocab 16 --steps 1 --dp 2 --ep 2
echo "train_moe.sh: ok"
