#!/usr/bin/env bash
# --precision bf16 (bf16 operands at the matrix products, fp32 everything else) under
# parallel layouts with real processes, against the serial bf16 run: dp 2 x tp 2 with
# sequence parallelism (its norms' outputs gathered in bf16: the bytes counted), pp 2 x tp 2
# with zero-bubble's split backward (the deferred weight gradients round their operands when
# they run), cp 2 x tp 2 (ring attention; its core stays fp32, its key/value blocks travel in
# bf16: the bytes counted), dp 2 with ZeRO-3 and full recompute (the parameters gathered per unit, the forward
# run again in the backward); and a checkpoint saved by dp 2 x tp 2 in bf16 continued by the
# serial bf16 run.
#
# Bounds (the serial bf16 run is the reference). A layout sums in another order than the
# serial run (tp's partial sums, dp's reduction): fp32 values about 1e-7 apart, which the
# fp32 layouts keep (compare_runs.sh's 1e-5). Under bf16 an operand that lies within that
# distance of a rounding midpoint rounds to the other neighbour: that element moves by 2^-8
# of itself instead of 2^-24. Few elements do (about 2^-16 of them), so step 1, which starts
# from the same weights, stays within the fp32 layouts' 1e-5 (measured 5e-10 to 8.9e-7, the
# largest pp 2 x tp 2 zb-h1); after that AdamW turns the moved elements into different
# updates and the runs drift apart like two seeds of rounding noise: losses 2e-4 (measured
# 1.9e-5 to 3.5e-5), later gradient norms 5e-3 (measured 2.3e-4 to 8.8e-4). The step-1
# bound is what tells bf16 from fp32 here: the serial fp32 run's step-1 norm is 6e-4 away
# from the serial bf16 run's (asserted > 1e-4).
#   train_bf16.sh <mpirun command...> <path to ndmesh>
source "$(dirname "$0")/train_lib.sh" "$@"
LOSS_BOUND=2e-4
GRAD1_BOUND=1e-5
GRAD_BOUND=5e-3

common=(--layers 2 --hidden 32 --markov-vocab 16 --threads 1 --eval-batches 1 --warmup 2 --batch 12 --steps 20
  --seq 16 --heads 4 --kv-heads 2 --json)

serial() { # serial <name> <flags...>
  local name=$1
  shift
  "$ndmesh" train "${common[@]}" "$@" > "$tmp/$name.out" 2> "$tmp/$name.err" ||
    fail "serial $name: exit $? $(cat "$tmp/$name.err")"
  tail -n 1 "$tmp/$name.out" > "$tmp/$name.json"
  expect_numbers "serial $name" "$tmp/$name.json" 20
}
serial bf16 --precision bf16
serial fp32 --precision fp32
jq -e '.precision == "bf16"' "$tmp/bf16.json" > /dev/null || fail "the serial bf16 run's JSON says another precision"
read -r _ g1 _ <<< "$(run_diffs "$tmp/bf16.json" "$tmp/fp32.json" 0)"
echo "serial fp32 vs serial bf16: step-1 gradient norm $g1"
awk -v d="$g1" 'BEGIN{exit !(d > 1e-4)}' || fail "serial fp32 and bf16 step-1 gradient norms are $g1 apart: no rounding"

check() { # check <ranks> <name> <flags...>: equal to the serial bf16 run within the bounds above
  local np=$1 name=$2
  shift 2
  "${mpirun[@]}" -np "$np" "$ndmesh" train "${common[@]}" --precision bf16 "$@" > "$tmp/$name.out" 2> "$tmp/$name.err" ||
    fail "$name: exit $? $(cat "$tmp/$name.err")"
  tail -n 1 "$tmp/$name.out" > "$tmp/$name.json"
  expect_same "$name bf16 vs serial bf16" "$tmp/bf16.json" "$tmp/$name.json"
}
check 4 dp2_tp2_sp --dp 2 --tp 2 --sequence-parallel
# The norms' outputs are gathered over tp in bf16 (the qkv and fc products round them anyway):
# of one step's all-gathers of N C elements (N = 12 / dp 2 x 16 = 96 rows, C = 32, L = 2 blocks,
# one micro-batch; tests/mpi/train_tp.sh counts them in fp32), the 2 per block forward and the
# 2 per block gathered again in the backward move 2 bytes an element, the other 2 L + 3 (d out
# in the backward, the final norm and its backward gather, the embedding's gradient) 4 bytes.
jq -e '.tp_comm_per_step.all_gather == {"calls": 15, "bytes": (8 * 96 * 32 * 2 + 7 * 96 * 32 * 4)}' \
  "$tmp/dp2_tp2_sp.json" > /dev/null ||
  fail "dp2_tp2_sp bf16: tp all-gathers $(jq -c .tp_comm_per_step.all_gather "$tmp/dp2_tp2_sp.json"), expected 15 calls of $((8 * 96 * 32 * 2 + 7 * 96 * 32 * 4)) bytes"
check 4 pp2_tp2_sp_zbh1 --pp 2 --tp 2 --sequence-parallel --schedule zb-h1 --micro-batch 2
check 4 cp2_tp2_sp --cp 2 --tp 2 --sequence-parallel
# The ring moves the key/value blocks in bf16 (they are bf16 values: exact) and the dK/dV sums
# in fp32. Per rank and step (one micro-batch of 12 sequences, 16 / cp 2 = 8 positions: 96
# rows; k | v of kv_heads 2 / tp 2 = 1 head of 8: 16 columns; L = 2 layers): one block sent
# per layer forward and one backward (cp - 1 each), two accumulators per layer backward (cp).
jq -e '.cp_comm_per_step == {"kv": {"calls": 4, "bytes": (4 * 96 * 16 * 2)}, "dkv": {"calls": 4, "bytes": (4 * 96 * 16 * 4)}}' \
  "$tmp/cp2_tp2_sp.json" > /dev/null ||
  fail "cp2_tp2_sp bf16: cp ring $(jq -c .cp_comm_per_step "$tmp/cp2_tp2_sp.json"), expected 4 blocks of $((96 * 16 * 2)) bytes and 4 accumulators of $((96 * 16 * 4))"
check 2 dp2_zero3_full --dp 2 --zero 3 --recompute full --micro-batch 3

# Checkpoints stay fp32 and load under any layout and precision: saved by dp 2 x tp 2 in
# bf16 at step 10, continued serially in bf16: steps 11-20 as the uninterrupted serial run's.
"${mpirun[@]}" -np 4 "$ndmesh" train "${common[@]}" --precision bf16 --dp 2 --tp 2 --until 10 --save "$tmp/ck" \
  > "$tmp/first.out" 2> "$tmp/first.err" || fail "save under dp 2 x tp 2: exit $? $(cat "$tmp/first.err")"
"$ndmesh" checkpoint inspect "$tmp/ck" --verify > "$tmp/inspect.txt" 2>&1 || fail "checkpoint inspect: $(cat "$tmp/inspect.txt")"
"$ndmesh" train "${common[@]}" --precision bf16 --load "$tmp/ck" > "$tmp/resumed.out" 2> "$tmp/resumed.err" ||
  fail "serial --load: exit $? $(cat "$tmp/resumed.err")"
tail -n 1 "$tmp/resumed.out" > "$tmp/resumed.json"
expect_same "dp2_tp2 bf16 saved at 10, serial bf16 resumed" "$tmp/bf16.json" "$tmp/resumed.json" --from 10
