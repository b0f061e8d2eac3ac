#!/usr/bin/env bash
# ZeRO-3 (fully sharded parameters) with real processes: the parameters, gradients and
# AdamW state are sharded over the gradient group (dp, or dp x cp); each unit (the
# embedding, every block, the head) is all-gathered before its forward and its backward and
# freed after, the next unit's gather prefetched. For dp 2 and 4 (micro-batches, no
# prefetch, no reshard after forward, bf16 gradient reduction), dp 2 x tp 2 with sequence
# parallelism, dp 2 x pp 2 (1f1b, interleaved, zb-h1), dp 2 x cp 2, and recompute, the
# losses and gradient norms of 12 steps equal the serial run's (train_lib.sh's bounds);
# memory_bytes shows the parameters sharded; checkpoints move between ZeRO-3 and other
# layouts both ways; bad values of its flags fail cleanly. (Odd group sizes, whose units are
# padded, are checked in-process: tests/unit/parallel/test_grad_reducer.cpp.)
#   train_zero3.sh <mpirun command...> <path to ndmesh>
source "$(dirname "$0")/train_lib.sh" "$@"

model=(--layers 4 --hidden 32 --heads 4 --kv-heads 2 --seq 16 --markov-vocab 16 --threads 1 --eval-batches 1
  --warmup 2 --batch 8 --steps 12 --json)

"$ndmesh" train "${model[@]}" | tail -n 1 > "$tmp/serial.json"
"$ndmesh" train "${model[@]}" --untied | tail -n 1 > "$tmp/serial_untied.json"
"$ndmesh" train "${model[@]}" --recompute full | tail -n 1 > "$tmp/serial_full.json"

run() {  # run <ranks> <name> <flags...>: the run's JSON line in $tmp/<name>.json
  local np=$1 name=$2
  shift 2
  "${mpirun[@]}" -np "$np" "$ndmesh" train "${model[@]}" "$@" > "$tmp/$name.out" 2> "$tmp/$name.err" ||
    fail "$name: exit $? $(tail -5 "$tmp/$name.err")"
  tail -n 1 "$tmp/$name.out" > "$tmp/$name.json"
}
check() {  # check <serial> <ranks> <name> <flags...>
  local serial=$1
  shift
  run "$@"
  expect_same "$2 vs serial" "$tmp/$serial.json" "$tmp/$2.json"
}

check serial 2 dp2 --dp 2 --zero 3
check serial 4 dp4 --dp 4 --zero 3 --micro-batch 1
check serial 2 dp2_no_prefetch --dp 2 --zero 3 --zero3-prefetch false --micro-batch 2
check serial 2 dp2_keep --dp 2 --zero 3 --zero3-reshard-after-forward false --micro-batch 2
check serial_untied 2 dp2_untied --dp 2 --zero 3 --untied
check serial 4 dp2_tp2_sp --dp 2 --tp 2 --sequence-parallel --zero 3 --micro-batch 2
check serial 4 dp2_pp2 --dp 2 --pp 2 --zero 3 --micro-batch 1
check serial 4 dp2_pp2_interleaved --dp 2 --pp 2 --schedule interleaved --vpp 2 --zero 3 --micro-batch 1
check serial_untied 4 dp2_pp2_zb --dp 2 --pp 2 --schedule zb-h1 --zero 3 --micro-batch 1 --untied
check serial 4 dp2_cp2 --dp 2 --cp 2 --zero 3
check serial_full 2 dp2_recompute --dp 2 --zero 3 --recompute full --micro-batch 2

# Each rank keeps 1/dp of the parameters, gradients and optimizer state, plus the units
# gathered at once (measured): less than a quarter of dp 1's parameters for the 4 blocks'
# model on dp 4 plus one block and the head, never the whole.
run 1 dp1 --dp 1 --zero 3
jq -n -e --slurpfile a "$tmp/dp1.json" --slurpfile b "$tmp/dp4.json" '
  ($a[0].memory_bytes) as $s | ($b[0].memory_bytes) as $z
  | $z.grads * 4 == $s.grads and $z.optimizer * 4 == $s.optimizer and $z.params_gathered > 0
  and $z.params == $s.params / 4 + $z.params_gathered and $z.params < 0.75 * $s.params' > /dev/null ||
  fail "ZeRO-3 memory on dp 4 vs dp 1: $(jq -c .memory_bytes "$tmp/dp1.json" "$tmp/dp4.json")"
echo "memory_bytes.params: dp 1 $(jq .memory_bytes.params "$tmp/dp1.json"), ZeRO-3 dp 4 $(jq .memory_bytes.params "$tmp/dp4.json") ($(jq .memory_bytes.params_gathered "$tmp/dp4.json") of it gathered)"
# Without resharding after the forward the units stay gathered until their backward.
jq -n -e --slurpfile a "$tmp/dp2.json" --slurpfile b "$tmp/dp2_keep.json" \
  '$b[0].memory_bytes.params_gathered > $a[0].memory_bytes.params_gathered' > /dev/null ||
  fail "--zero3-reshard-after-forward false gathers no more: $(jq -c .memory_bytes "$tmp/dp2.json" "$tmp/dp2_keep.json")"

# Checkpoints: saved under ZeRO-3 at step 6, resumed under other layouts; and the reverse.
"${mpirun[@]}" -np 4 "$ndmesh" train "${model[@]}" --dp 2 --pp 2 --zero 3 --micro-batch 1 --until 6 --save "$tmp/z3" \
  > /dev/null 2> "$tmp/save.err" || fail "save under ZeRO-3: $(tail -3 "$tmp/save.err")"
"${mpirun[@]}" -np 2 "$ndmesh" train "${model[@]}" --dp 2 --zero 1 --until 6 --save "$tmp/z1" > /dev/null 2> "$tmp/save.err" ||
  fail "save under ZeRO-1: $(tail -3 "$tmp/save.err")"
for resume in "z3 1 --dp 1" "z3 4 --dp 2 --tp 2 --zero 2" "z3 4 --dp 4 --zero 3" "z1 4 --dp 2 --cp 2 --zero 3" \
  "z1 2 --dp 2 --zero 3 --micro-batch 2"; do
  set -- $resume
  name=$1 np=$2
  shift 2
  "${mpirun[@]}" -np "$np" "$ndmesh" train "${model[@]}" "$@" --load "$tmp/$name" 2> "$tmp/resume.err" | tail -n 1 \
    > "$tmp/resumed.json" || fail "load of $name under $*: $(tail -3 "$tmp/resume.err")"
  expect_same "saved under $name, resumed under $*" "$tmp/serial.json" "$tmp/resumed.json" --from 6
done

expect_train_usage "--zero=4 is not a ZeRO stage ndmesh train runs; use 0, 1, 2 or 3" 2 "${model[@]}" --dp 2 --zero 4
expect_train_usage "--zero3-prefetch" 2 "${model[@]}" --dp 2 --zero 3 --zero3-prefetch maybe
echo "train_zero3.sh: ok"
