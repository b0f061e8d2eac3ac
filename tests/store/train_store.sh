#!/usr/bin/env bash
# Training launched without mpirun reproduces the serial losses and gradient norms
# (train_lib.sh's expect_same bounds): dp x tp
# with sequence parallelism, pp 1F1B with dp, cp zigzag, and a 3D layout of 8 ranks,
# under both store modes (the launcher's agent serving a PyTorch TCPStore, or rank 0).
#   train_store.sh <launcher command...> <path to ndmesh>
# The launcher command is tests/store/torchrun_env.py [--agent-store] (it takes -np N).
source "$(dirname "$0")/../mpi/train_lib.sh" "$@"
model=(--layers 4 --hidden 32 --heads 4 --kv-heads 2 --seq 16 --markov-vocab 16 --threads 1 --eval-batches 0
  --batch 8 --steps 4 --seed 4242 --json)
"$ndmesh" train "${model[@]}" 2> "$tmp/serial.err" | tail -n 1 > "$tmp/serial.json" || fail "serial: $(cat "$tmp/serial.err")"
run() {
  local name=$1 np=$2
  shift 2
  NDMESH_LOG=debug "${mpirun[@]}" -np "$np" "$ndmesh" train "${model[@]}" "$@" > "$tmp/$name.out" 2> "$tmp/$name.err" ||
    fail "$name ($*): $(tail -n 5 "$tmp/$name.err")"
  tail -n 1 "$tmp/$name.out" > "$tmp/$name.json"
  [ "$(grep -c '\[comm\] gloo world of' "$tmp/$name.err")" -eq "$np" ] || fail "$name did not run on gloo"
  expect_same "$name ($*)" "$tmp/serial.json" "$tmp/$name.json"
}
run dp_tp 4 --dp 2 --tp 2 --sequence-parallel
run pp_dp 4 --pp 2 --dp 2 --micro-batch 2 --schedule 1f1b
run cp 2 --cp 2
run dp_pp_tp 8 --dp 2 --pp 2 --tp 2 --micro-batch 2
echo PASS
