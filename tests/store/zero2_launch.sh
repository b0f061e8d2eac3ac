#!/usr/bin/env bash
# ZeRO-2 over Gloo under `ndmesh launch --store` (its gradients reduce-scattered by the
# ring reduce-scatter of comm/allreduce.hpp, on 4 ranks and on 3, not a power of two) reproduces the
# serial run's losses and gradient norms.
#   zero2_launch.sh <ndmesh>
source "$(dirname "$0")/../mpi/train_lib.sh"
model=(--layers 2 --hidden 32 --heads 4 --kv-heads 2 --seq 16 --markov-vocab 16 --threads 1 --eval-batches 0
  --batch 12 --steps 4 --seed 919 --json)
"$ndmesh" train "${model[@]}" 2> /dev/null | tail -n 1 > "$tmp/serial.json" || fail "serial run"
jq -e '(.losses | length) == 4 and (.grad_norms | length) == 4' "$tmp/serial.json" > /dev/null ||
  fail "the serial run printed no losses or gradient norms: $(cat "$tmp/serial.json")"
for dp in 4 3; do
  timeout -k 10 300 "$ndmesh" launch --store --no-tag -n $dp -- "$ndmesh" train "${model[@]}" --dp $dp --zero 2 \
    2> "$tmp/err" | tail -n 1 > "$tmp/zero2.json" || fail "dp $dp ZeRO-2: $(tail -n 3 "$tmp/err")"
  expect_same "dp $dp ZeRO-2 under ndmesh launch --store (Gloo)" "$tmp/serial.json" "$tmp/zero2.json"
done
echo PASS
