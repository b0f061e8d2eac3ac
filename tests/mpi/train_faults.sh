#!/usr/bin/env bash
# A rank killed (SIGKILL) in the middle of 4D training: every other rank ends, non-zero,
# within twice NDMESH_TIMEOUT_S, and the checkpoint written every few steps is never left
# half-written (it is written to a temporary file and renamed): after the kill the last
# good one loads and training resumes from it.
#   train_faults.sh <mpirun command...> <path to ndmesh>
source "$(dirname "$0")/train_lib.sh" "$@"
set +e  # exit statuses are checked by hand here
trap 'pkill -9 -f -- "--seed 7771" 2>/dev/null; rm -rf "$tmp"' EXIT
timeout_s=5
model=(--layers 4 --hidden 32 --heads 4 --kv-heads 2 --seq 16 --markov-vocab 16 --threads 1 --eval-batches 0
  --batch 8 --seed 7771)

NDMESH_TIMEOUT_S=$timeout_s "${mpirun[@]}" -np 4 "$ndmesh" train "${model[@]}" --dp 2 --tp 2 --sequence-parallel \
  --steps 1000000 --save "$tmp/run.ckpt" --save-every 2 > "$tmp/out.txt" 2>&1 &
job=$!
# Wait for a few steps and at least one checkpoint.
for _ in $(seq 1 600); do
  grep -q '^step 6/' "$tmp/out.txt" 2>/dev/null && [ -f "$tmp/run.ckpt" ] && break
  kill -0 "$job" 2>/dev/null || fail "training ended before the kill: $(cat "$tmp/out.txt")"
  sleep 0.1
done
[ -f "$tmp/run.ckpt" ] || fail "no checkpoint after 60 s: $(tail -5 "$tmp/out.txt")"
victim=$(pgrep -f -- "ndmesh train .*--seed 7771" | grep -vx "$job" | tail -n 1)
[ -n "$victim" ] || fail "no rank process found"
kill -9 "$victim"
start=$(date +%s.%N)
wait "$job"
rc=$?
elapsed=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b - a}')
tail -n 8 "$tmp/out.txt"
echo "job ended ${elapsed} s after the kill (limit $((2 * timeout_s)) s), exit $rc"
[ "$rc" -ne 0 ] || fail "the job exited 0 after a rank was killed"
awk -v e="$elapsed" -v t="$timeout_s" 'BEGIN{exit !(e < 2 * t)}' || fail "the job took ${elapsed} s to end"
pgrep -f -- "--seed 7771" > /dev/null && fail "ranks still running after the job ended"

# The last good checkpoint loads (any layout) and training continues from it.
out=$("$ndmesh" train "${model[@]}" --steps 1000000 --until "$(($(grep -c '^step ' "$tmp/out.txt") + 4))" \
  --load "$tmp/run.ckpt" --json 2>&1) || fail "the checkpoint left by the killed job does not load: $out"
echo "$out" | tail -n 1 | jq -e '.steps > 0' > /dev/null || fail "no steps after loading: $out"
ls "$tmp" | grep -v -e '^run.ckpt$' -e '^out.txt$' && echo "(temporary files above were left by the kill)"
echo "train_faults.sh: ok (resumed at step $(echo "$out" | tail -n 1 | jq .first_step))"
