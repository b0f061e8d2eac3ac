#!/usr/bin/env bash
# `ndmesh launch --store` needs no mpirun: 4 ranks with torchrun's variables, dp x tp
# training equal to the serial run (losses and gradient norms), rank-tagged output, a failing rank's exit status.
#   ndmesh_launch_store.sh <ndmesh>
set -uo pipefail
ndmesh=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model=(--layers 2 --hidden 32 --heads 4 --kv-heads 2 --seq 16 --markov-vocab 16 --threads 1 --eval-batches 0
  --batch 8 --steps 3 --seed 515 --json)
"$ndmesh" train "${model[@]}" 2> /dev/null | tail -n 1 > "$tmp/serial.json" || fail "serial run"
# No mpirun on PATH: the launcher and the ranks must not need it.
PATH=/nonexistent:/usr/bin:/bin "$ndmesh" launch --store --no-tag -n 4 -- "$ndmesh" train "${model[@]}" --dp 2 --tp 2 \
  2> "$tmp/err" | tail -n 1 > "$tmp/par.json" || fail "launch --store: $(tail -n 3 "$tmp/err")"
source "$(dirname "$0")/../support/compare_runs.sh"
expect_same "dp 2 x tp 2 under ndmesh launch --store" "$tmp/serial.json" "$tmp/par.json"
out=$("$ndmesh" launch --store -n 2 -- "$ndmesh" check --tp 2 2>&1) || fail "check: $out"
[[ "$out" == *"[0] verified 7 groups: all match the mesh"* ]] || fail "no tagged summary: $out"
"$ndmesh" launch --store -n 2 -- "$ndmesh" check --tp 4 > /dev/null 2>&1
[ $? -eq 2 ] || fail "a rank's exit 2 must be the launch's"
echo PASS
