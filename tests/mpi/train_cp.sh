#!/usr/bin/env bash
# Context-parallel training with real processes: ring attention over --cp ranks, zigzag
# and contiguous layouts, multi-head and grouped-query, cp alone and dp x cp (also with
# ZeRO 1): the losses of 20 steps equal the serial run's within 1e-5 relative, and what the
# ring moves is counted (cp_comm_per_step). Bad
# sequence lengths and layouts fail cleanly naming the flags. A checkpoint saved under
# dp x cp continues serially and under another cp layout with the uninterrupted losses.
#   train_cp.sh <mpirun command...> <path to ndmesh>
source "$(dirname "$0")/train_lib.sh" "$@"

base=(--layers 2 --hidden 32 --heads 4 --batch 4 --threads 1 --steps 20 --markov-vocab 16
  --eval-batches 1 --warmup 2 --json)

for kv in 4 2 1; do
  "$ndmesh" train "${base[@]}" --seq 32 --kv-heads "$kv" | tail -n 1 > "$tmp/serial_kv$kv.json"
  jq -e '.losses | length == 20' "$tmp/serial_kv$kv.json" > /dev/null || fail "serial kv $kv has no 20 losses"
done

check() {  # check <ranks> <kv heads> <name> <flags...>: equal to the serial run within 1e-5
  local np=$1 kv=$2 name=$3
  shift 3
  "${mpirun[@]}" -np "$np" "$ndmesh" train "${base[@]}" --seq 32 --kv-heads "$kv" "$@" > "$tmp/$name.out" 2> "$tmp/$name.err" ||
    fail "$name: exit $? $(cat "$tmp/$name.err")"
  tail -n 1 "$tmp/$name.out" > "$tmp/$name.json"
  [ "$(grep -c '^step ' "$tmp/$name.out")" -eq 20 ] || fail "$name: rank 0 should print 20 step lines"
  expect_same "$name vs serial" "$tmp/serial_kv$kv.json" "$tmp/$name.json"
}

check 2 4 cp2_zigzag --cp 2
check 2 4 cp2_contiguous --cp 2 --cp-layout contiguous
check 4 4 cp4_zigzag --cp 4
check 4 4 cp4_contiguous --cp 4 --cp-layout contiguous
check 2 2 cp2_gqa --cp 2
check 4 1 cp4_mqa_contiguous --cp 4 --cp-layout contiguous
check 4 2 dp2_cp2 --dp 2 --cp 2
check 4 2 dp2_cp2_zero1_micro --dp 2 --cp 2 --zero 1 --micro-batch 1 --bucket-mb 0.01

# What the ring moves per rank and step, fp32: cp 4, 4 sequences of 32 / 4 = 8 positions (32
# rows), k | v of 4 heads of 8 (64 columns), 2 layers: cp - 1 = 3 blocks per layer forward and
# 3 backward, whether the causal mask skips them or not, and cp = 4 dK/dV accumulators per
# layer backward, each 32 x 64 x 4 bytes.
jq -e '.cp_comm_per_step == {"kv": {"calls": 12, "bytes": (12 * 32 * 64 * 4)}, "dkv": {"calls": 8, "bytes": (8 * 32 * 64 * 4)}}' \
  "$tmp/cp4_zigzag.json" > /dev/null || fail "cp4_zigzag: cp ring $(jq -c .cp_comm_per_step "$tmp/cp4_zigzag.json")"
jq -e '.cp_comm_per_step.kv.calls == 0' "$tmp/serial_kv4.json" > /dev/null || fail "the serial run counts cp transfers"
jq -e '.layout.cp == 2 and .layout.dp == 2' "$tmp/dp2_cp2.json" > /dev/null || fail "dp2_cp2 layout: $(jq -c .layout "$tmp/dp2_cp2.json")"
grep -q "context parallel: 2 ranks, zigzag layout, 16 of 32 tokens" "$tmp/cp2_zigzag.out" || fail "cp2 does not print its layout"

# Save under dp 2 x cp 2 (ZeRO 1) at step 10, continue serially and under cp 2: steps 11..20 as uninterrupted.
"${mpirun[@]}" -np 4 "$ndmesh" train "${base[@]}" --seq 32 --kv-heads 2 --dp 2 --cp 2 --zero 1 --until 10 \
  --save "$tmp/ck.bin" > /dev/null || fail "save under dp 2 x cp 2"
for layout in "1 --dp 1" "2 --cp 2 --cp-layout contiguous"; do
  set -- $layout
  np=$1
  shift
  "${mpirun[@]}" -np "$np" "$ndmesh" train "${base[@]}" --seq 32 --kv-heads 2 "$@" --load "$tmp/ck.bin" |
    tail -n 1 > "$tmp/resumed.json" || fail "load under $layout"
  expect_same "saved under dp 2 x cp 2, resumed under $layout" "$tmp/serial_kv2.json" "$tmp/resumed.json" --from 10
done

expect_usage() {  # expect_usage <needle> <ranks> <flags...>
  local needle=$1 np=$2
  shift 2
  expect_train_usage "$needle" "$np" "${base[@]}" "$@"
}
expect_usage "--seq=20 is not divisible by 8 (--cp=4, zigzag layout" 4 --cp 4 --seq 20
expect_usage "--seq=30 is not divisible by 4 (--cp=4, contiguous layout" 4 --cp 4 --seq 30 --cp-layout contiguous
expect_usage "--cp-layout=spiral" 2 --cp 2 --seq 32 --cp-layout spiral
echo "train_cp.sh: ok"
