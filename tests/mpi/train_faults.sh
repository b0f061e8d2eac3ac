#!/usr/bin/env bash
# A rank killed (SIGKILL) in the middle of 4D training: every other rank ends, non-zero,
# within twice NDMESH_TIMEOUT_S, and the checkpoint written every few steps is never left
# half-written (it is written to a temporary directory and swapped in with one rename):
# after the kill the last good one loads and training resumes from it. Then a rank killed
# in the middle of a save (NDMESH_CHECKPOINT_PAUSE_S holds the save with its shard files
# written, before the manifest) leaves the previous checkpoint untouched.
#   train_faults.sh <mpirun command...> <path to ndmesh>
source "$(dirname "$0")/train_lib.sh" "$@"
set +e  # exit statuses are checked by hand here
# The ranks are found as the children of this test's own mpirun (never by a command-line
# pattern, which would also match a second suite running beside this one).
ranks=()
trap 'kill -9 "${ranks[@]}" 2>/dev/null; rm -rf "$tmp"' EXIT
timeout_s=5
model=(--layers 4 --hidden 32 --heads 4 --kv-heads 2 --seq 16 --markov-vocab 16 --threads 1 --eval-batches 0
  --batch 8 --seed 7771)

# kill_a_rank <when>: SIGKILLs one rank of the job $job (`timeout` over mpirun, whose
# children are the ranks); the job must end non-zero within twice the timeout, and with it
# every rank.
kill_a_rank() {
  local launcher victim start rc elapsed
  launcher=$(pgrep -P "$job" | head -n 1)
  [ -n "$launcher" ] || fail "no mpirun under the job $job ($1)"
  mapfile -t ranks < <(pgrep -P "$launcher")
  [ "${#ranks[@]}" -eq 4 ] || fail "mpirun $job has ${#ranks[@]} rank processes, expected 4 ($1)"
  victim=${ranks[-1]}
  kill -9 "$victim"
  start=$(date +%s.%N)
  wait "$job"
  rc=$?
  elapsed=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.2f", b - a}')
  echo "job with a rank killed $1 ended ${elapsed} s after the kill (limit $((2 * timeout_s)) s), exit $rc"
  [ "$rc" -ne 0 ] || fail "the job exited 0 after a rank was killed $1"
  awk -v e="$elapsed" -v t="$timeout_s" 'BEGIN{exit !(e < 2 * t)}' || fail "the job took ${elapsed} s to end ($1)"
  local r
  for r in "${ranks[@]}"; do  # gone, or a zombie waiting to be reaped by init
    [ "$(awk '{print $3}' "/proc/$r/stat" 2> /dev/null || echo Z)" = Z ] ||
      fail "rank process $r still runs after the job ended ($1)"
  done
  return 0
}

NDMESH_TIMEOUT_S=$timeout_s "${mpirun[@]}" -np 4 "$ndmesh" train "${model[@]}" --dp 2 --tp 2 --sequence-parallel \
  --steps 1000000 --save "$tmp/run.ckpt" --save-every 2 > "$tmp/out.txt" 2>&1 &
job=$!
# Wait for a few steps and at least one checkpoint.
for _ in $(seq 1 600); do
  grep -q '^step 6/' "$tmp/out.txt" 2>/dev/null && [ -f "$tmp/run.ckpt/manifest.json" ] && break
  kill -0 "$job" 2>/dev/null || fail "training ended before the kill: $(cat "$tmp/out.txt")"
  sleep 0.1
done
[ -f "$tmp/run.ckpt/manifest.json" ] || fail "no checkpoint after 60 s: $(tail -5 "$tmp/out.txt")"
kill_a_rank "mid-step"
tail -n 8 "$tmp/out.txt"

# The last good checkpoint loads (any layout) and training continues from it.
out=$("$ndmesh" train "${model[@]}" --steps 1000000 --until "$(($(grep -c '^step ' "$tmp/out.txt") + 4))" \
  --load "$tmp/run.ckpt" --json 2>&1) || fail "the checkpoint left by the killed job does not load: $out"
echo "$out" | tail -n 1 | jq -e '.steps > 0' > /dev/null || fail "no steps after loading: $out"
"$ndmesh" checkpoint inspect "$tmp/run.ckpt" --verify > /dev/null || fail "the checkpoint left by the kill does not verify"
echo "resumed at step $(echo "$out" | tail -n 1 | jq .first_step) from the checkpoint the killed job left"

# A kill in the middle of a save: the shard files of the new checkpoint are written into
# the temporary directory, the manifest is not; the previous checkpoint stays whole.
before=$(md5sum "$tmp/run.ckpt/manifest.json")
saved_step=$(jq .step "$tmp/run.ckpt/manifest.json")
NDMESH_CHECKPOINT_PAUSE_S=120 NDMESH_TIMEOUT_S=$timeout_s "${mpirun[@]}" -np 4 "$ndmesh" train "${model[@]}" \
  --dp 2 --tp 2 --sequence-parallel --steps 1000000 --load "$tmp/run.ckpt" --save "$tmp/run.ckpt" --save-every 2 \
  > "$tmp/out2.txt" 2>&1 &
job=$!
for _ in $(seq 1 600); do
  [ "$(ls "$tmp/.run.ckpt.saving" 2>/dev/null | grep -c '^shard-')" -eq 2 ] && break
  kill -0 "$job" 2>/dev/null || fail "training ended before the save: $(cat "$tmp/out2.txt")"
  sleep 0.1
done
sleep 0.5  # the shard files are complete when every writer has agreed; the pause follows
[ -e "$tmp/.run.ckpt.saving/manifest.json" ] && fail "the manifest was written before the pause"
kill_a_rank "during its save"
[ "$(md5sum "$tmp/run.ckpt/manifest.json")" = "$before" ] || fail "the interrupted save changed the manifest"
"$ndmesh" checkpoint inspect "$tmp/run.ckpt" --verify > "$tmp/inspect.txt" ||
  fail "the previous checkpoint does not verify after an interrupted save: $(cat "$tmp/inspect.txt")"
grep -q "^step $saved_step " "$tmp/inspect.txt" || fail "the checkpoint is not the one of step $saved_step"
# The next save clears the leftover temporary directory.
"$ndmesh" train "${model[@]}" --steps 1000000 --until $((saved_step + 1)) --load "$tmp/run.ckpt" \
  --save "$tmp/run.ckpt" > /dev/null || fail "save after an interrupted save"
[ -e "$tmp/.run.ckpt.saving" ] && fail "the leftover temporary directory was not cleared"
[ "$(jq .step "$tmp/run.ckpt/manifest.json")" -eq $((saved_step + 1)) ] || fail "the new checkpoint is not in place"
echo "train_faults.sh: ok (an interrupted save left the checkpoint of step $saved_step whole)"
