#!/usr/bin/env bash
# Offload of the optimizer state (--offload optimizer --offload-dir DIR) with real processes:
#  (a) serial, dp 2 with ZeRO 1 and dp 2 with ZeRO 2: the per-step losses and gradient norms
#      with offload are those without it bit for bit (the JSON numbers compared as
#      strings), with the state streamed in chunks that cut through the parameters
#      (--offload-chunk-mb 0.01: about 50 chunks a step) and in one chunk; the optimizer
#      bytes the run reports as offloaded are the in-memory run's optimizer bytes, and every
#      byte of them is read and written once per step; the offload folder is empty after;
#  (b) a process killed (SIGKILL) in the middle of an optimizer write-back
#      (NDMESH_OFFLOAD_PAUSE_S holds it there) leaves the last checkpoint whole; the next
#      start with the same --offload-dir is refused in one line naming the files it found
#      and the command that clears them; after that command the run resumes from the
#      checkpoint with the losses of the uninterrupted run;
#  (a') --offload optimizer+params under ZeRO-3 (dp 2, dp 2 x pp 2): bit for bit as without,
#      the shard reported offloaded, checkpoints to and from it (see below);
#  (c) bad values of the flags exit 2 with one line naming the flag.
#   train_offload.sh <mpirun command...> <path to ndmesh>
source "$(dirname "$0")/train_lib.sh" "$@"

model=(--layers 2 --hidden 64 --heads 4 --kv-heads 2 --seq 32 --vocab 32)
common=("${model[@]}" --markov-vocab 32 --batch 8 --micro-batch 2 --threads 1 --eval-batches 1 --json)
odir="$tmp/offload"
mkdir -p "$odir"

# launch <name> <ranks> <flags...>: ndmesh train on that many ranks; the JSON in $tmp/<name>.json.
launch() {
  local name=$1 np=$2
  shift 2
  if [ "$np" -gt 1 ]; then
    "${mpirun[@]}" -np "$np" "$ndmesh" train "${common[@]}" --steps 4 "$@" > "$tmp/$name.out" 2> "$tmp/$name.err" ||
      fail "$name: exit $? $(tail -3 "$tmp/$name.err")"
  else
    "$ndmesh" train "${common[@]}" --steps 4 "$@" > "$tmp/$name.out" 2> "$tmp/$name.err" ||
      fail "$name: exit $? $(tail -3 "$tmp/$name.err")"
  fi
  tail -n 1 "$tmp/$name.out" > "$tmp/$name.json"
}

# (a)
for layout in "serial 1" "dp2_zero1 2 --dp 2 --zero 1" "dp2_zero2 2 --dp 2 --zero 2"; do
  read -r -a args <<< "$layout"
  name=${args[0]} np=${args[1]}
  flags=("${args[@]:2}")
  launch "$name" "$np" "${flags[@]}"
  for chunk in 0.01 32; do
    launch "$name.off$chunk" "$np" "${flags[@]}" --offload optimizer --offload-dir "$odir" --offload-chunk-mb $chunk
    for field in losses grad_norms; do
      a=$(grep -o "\"$field\":\[[^]]*\]" "$tmp/$name.json")
      b=$(grep -o "\"$field\":\[[^]]*\]" "$tmp/$name.off$chunk.json")
      [ -n "$a" ] && [ "$a" = "$b" ] ||
        fail "$name --offload-chunk-mb $chunk: $field $b differ from those without offload $a"
    done
    jq -e --slurpfile m "$tmp/$name.json" '.offload == "optimizer" and
      .memory_bytes.optimizer_offloaded == $m[0].memory_bytes.optimizer and $m[0].memory_bytes.optimizer > 0 and
      $m[0].memory_bytes.optimizer_offloaded == 0 and
      .offload_io.bytes_read_per_step >= .memory_bytes.optimizer_offloaded and
      .offload_io.bytes_written_per_step == .offload_io.bytes_read_per_step' "$tmp/$name.off$chunk.json" > /dev/null ||
      fail "$name --offload-chunk-mb $chunk: offloaded bytes or I/O do not match: $(jq -c '[.memory_bytes, .offload_io]' "$tmp/$name.off$chunk.json")"
    # The window is three chunks: 0.01 MiB chunks (rounded up to 1024 elements) keep it small.
    [ "$chunk" != 0.01 ] || jq -e '.memory_bytes.optimizer <= 3 * 8 * 2048' "$tmp/$name.off$chunk.json" > /dev/null ||
      fail "$name --offload-chunk-mb $chunk: the window is $(jq .memory_bytes.optimizer "$tmp/$name.off$chunk.json") bytes"
    grep -q "^offload: optimizer state" "$tmp/$name.off$chunk.out" || fail "$name: no offload line"
    [ -z "$(ls -A "$odir")" ] || fail "$name: the offload folder is not empty after the run: $(ls "$odir")"
  done
  echo "$name: --offload optimizer gives the same losses and gradient norms bit for bit" \
    "($(jq -c '.offload_io' "$tmp/$name.off0.01.json"))"
done

# (a') --offload optimizer+params: under ZeRO-3 the rank's shard of the parameters lives in a
# file too (read back for each unit's gather, streamed with the moments by the step): dp 2
# (micro-batches; chunks of 0.01 MiB and 32) and dp 2 x pp 2 equal the same runs without
# offload bit for bit; the shard is reported offloaded and its bytes move every step; a
# checkpoint saved under it resumes with and without it as the uninterrupted run.
for layout in "z3_dp2 2 --dp 2 --zero 3" "z3_dp2_pp2 4 --dp 2 --pp 2 --zero 3"; do
  read -r -a args <<< "$layout"
  name=${args[0]} np=${args[1]}
  flags=("${args[@]:2}")
  launch "$name" "$np" "${flags[@]}"
  for chunk in 0.01 32; do
    launch "$name.par$chunk" "$np" "${flags[@]}" --offload optimizer+params --offload-dir "$odir" --offload-chunk-mb $chunk
    for field in losses grad_norms; do
      a=$(grep -o "\"$field\":\[[^]]*\]" "$tmp/$name.json")
      b=$(grep -o "\"$field\":\[[^]]*\]" "$tmp/$name.par$chunk.json")
      [ -n "$a" ] && [ "$a" = "$b" ] ||
        fail "$name --offload optimizer+params (chunk $chunk MiB): $field $b differ from those without offload $a"
    done
    # The shard (what the run without offload keeps: its params less the gathered units) is
    # in files; what stays is the gathered units; each step reads the shard at least once.
    jq -e --slurpfile m "$tmp/$name.json" '.offload == "optimizer+params" and
      .memory_bytes.params_offloaded == $m[0].memory_bytes.params - $m[0].memory_bytes.params_gathered and
      .memory_bytes.params_offloaded > 0 and $m[0].memory_bytes.params_offloaded == 0 and
      .memory_bytes.params == .memory_bytes.params_gathered and
      .offload_io.bytes_read_per_step >= .memory_bytes.optimizer_offloaded + .memory_bytes.params_offloaded' \
      "$tmp/$name.par$chunk.json" > /dev/null ||
      fail "$name --offload optimizer+params: memory or I/O: $(jq -c '[.memory_bytes, .offload_io]' "$tmp/$name.par$chunk.json")"
    [ -z "$(ls -A "$odir")" ] || fail "$name: the offload folder is not empty after the run: $(ls "$odir")"
  done
  echo "$name: --offload optimizer+params gives the same losses and gradient norms bit for bit" \
    "($(jq -c '[.memory_bytes.params, .memory_bytes.params_offloaded]' "$tmp/$name.par0.01.json"))"
done
"${mpirun[@]}" -np 2 "$ndmesh" train "${common[@]}" --steps 4 --until 2 --dp 2 --zero 3 --offload optimizer+params \
  --offload-dir "$odir" --save "$tmp/par.ckpt" > /dev/null 2> "$tmp/par_save.err" ||
  fail "save under optimizer+params: $(tail -3 "$tmp/par_save.err")"
for resume in "--dp 2 --zero 3 --offload optimizer+params --offload-dir $odir" "--dp 2 --zero 1"; do
  # shellcheck disable=SC2086
  launch par_resumed 2 $resume --load "$tmp/par.ckpt"
  expect_same "saved under optimizer+params, resumed under $resume" "$tmp/z3_dp2.json" "$tmp/par_resumed.json" --from 2
done

# (b) kill -9 during a write-back: each step's write-back waits 3 s once written.
ref_flags=(--steps 5)
"$ndmesh" train "${common[@]}" "${ref_flags[@]}" > "$tmp/ref.out" 2>&1 || fail "reference run: $(tail -3 "$tmp/ref.out")"
tail -n 1 "$tmp/ref.out" > "$tmp/ref.json"
ck="$tmp/run.ckpt"
NDMESH_OFFLOAD_PAUSE_S=3 "$ndmesh" train "${common[@]}" "${ref_flags[@]}" --offload optimizer --offload-dir "$odir" \
  --save "$ck" --save-every 1 > "$tmp/killed.out" 2>&1 &
pid=$!
for _ in $(seq 600); do
  [ -f "$ck/manifest.json" ] && [ "$(jq .step "$ck/manifest.json")" -ge 2 ] && break
  sleep 0.1
done
[ "$(jq .step "$ck/manifest.json")" -eq 2 ] || fail "no checkpoint of step 2 in time: $(cat "$tmp/killed.out")"
sleep 1 # step 3 is now in its write-back (3 s)
kill -9 $pid
wait $pid 2> /dev/null && fail "the killed run exited 0"
[ -n "$(ls -A "$odir")" ] || fail "the killed run left no offload file (was it in the write-back?)"
"$ndmesh" checkpoint inspect --verify "$ck" > "$tmp/inspect.txt" || fail "the checkpoint is not whole: $(cat "$tmp/inspect.txt")"
grep -q "^step 2 " "$tmp/inspect.txt" || fail "the checkpoint is not that of step 2: $(cat "$tmp/inspect.txt")"
set +e
"$ndmesh" train "${common[@]}" "${ref_flags[@]}" --offload optimizer --offload-dir "$odir" --load "$ck" > "$tmp/stale.out" 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] || fail "a start over the killed run's offload files exited $rc, expected 2: $(cat "$tmp/stale.out")"
[ "$(wc -l < "$tmp/stale.out")" -eq 1 ] || fail "the refusal is not one line: $(cat "$tmp/stale.out")"
grep -q "rank00000-chunk0.adamw" "$tmp/stale.out" || fail "the refusal does not name the file: $(cat "$tmp/stale.out")"
clear_cmd=$(sed -n 's/.*clear them with: \(rm -f .*\)$/\1/p' "$tmp/stale.out")
[ -n "$clear_cmd" ] || fail "the refusal gives no command: $(cat "$tmp/stale.out")"
echo "refused: $(cat "$tmp/stale.out")"
eval "$clear_cmd"
"$ndmesh" train "${common[@]}" "${ref_flags[@]}" --offload optimizer --offload-dir "$odir" --load "$ck" \
  > "$tmp/resumed.out" 2> "$tmp/resumed.err" || fail "resume: $(tail -3 "$tmp/resumed.err")"
tail -n 1 "$tmp/resumed.out" > "$tmp/resumed.json"
expect_same "resumed after the kill vs uninterrupted" "$tmp/ref.json" "$tmp/resumed.json" --from 2

# (c)
expect_train_usage "--offload=disk is not an offload mode" 1 "${common[@]}" --offload disk --offload-dir "$odir"
expect_train_usage "--offload=optimizer needs --offload-dir" 1 "${common[@]}" --offload optimizer
expect_train_usage "--offload-dir=$odir is given without --offload" 1 "${common[@]}" --offload-dir "$odir"
expect_train_usage "--offload=optimizer+params with --zero 0: the parameters live in files between uses only under ZeRO-3" \
  1 "${common[@]}" --offload optimizer+params --offload-dir "$odir"
expect_train_usage "--offload=optimizer+params needs ZeRO-3 over a gradient group of 2 or more ranks" 1 "${common[@]}" \
  --zero 3 --offload optimizer+params --offload-dir "$odir"
expect_train_usage "--offload-dir=$tmp/nowhere: not a writable folder" 1 "${common[@]}" --offload optimizer \
  --offload-dir "$tmp/nowhere"
expect_train_usage "--offload-chunk-mb=0 must be in" 1 "${common[@]}" --offload optimizer --offload-dir "$odir" \
  --offload-chunk-mb 0
# --memory: the choice is printed, flags given explicitly win, and [training] memory of --config.
out=$("$ndmesh" train "${common[@]}" --steps 1 --memory extreme --offload-dir "$odir" 2>&1 || true)
echo "$out" | grep -q "^memory: extreme (--memory) = --recompute full --zero 3 --offload optimizer" ||
  fail "--memory extreme: $out"
# extreme on dp 2 (ZeRO-3 with the moments offloaded, full recompute) equals the serial run.
launch serial_ref 1
launch mem_extreme 2 --dp 2 --memory extreme --offload-dir "$odir"
grep -q "^memory: extreme (--memory) = --recompute full --zero 3 --offload optimizer" "$tmp/mem_extreme.out" ||
  fail "--memory extreme on dp 2: $(head -2 "$tmp/mem_extreme.out")"
jq -e '.zero == 3 and .recompute == "full" and .memory_bytes.optimizer_offloaded > 0' "$tmp/mem_extreme.json" \
  > /dev/null || fail "--memory extreme did not apply ZeRO 3 and offload: $(tail -c 300 "$tmp/mem_extreme.json")"
expect_same "dp 2 --memory extreme (ZeRO-3 + offload + full recompute)" "$tmp/serial_ref.json" "$tmp/mem_extreme.json"
launch mem_aggr 1 --memory aggressive --zero 1 --dp 1
grep -q "^memory: aggressive (--memory) = --recompute full; given explicitly: --zero 1" "$tmp/mem_aggr.out" ||
  fail "--memory aggressive: $(head -2 "$tmp/mem_aggr.out")"
jq -e '.recompute == "full" and .zero == 1' "$tmp/mem_aggr.json" > /dev/null || fail "--memory aggressive did not apply"
printf '[training]\nmemory = "standard"\n' > "$tmp/mem.toml"
launch mem_toml 1 --config "$tmp/mem.toml"
jq -e '.recompute == "selective"' "$tmp/mem_toml.json" > /dev/null || fail "[training] memory did not apply"
grep -q "^memory: standard ($tmp/mem.toml \[training\] memory) = --recompute selective" "$tmp/mem_toml.out" ||
  fail "[training] memory: $(head -2 "$tmp/mem_toml.out")"
expect_train_usage "--memory=huge is not a memory strategy" 1 "${common[@]}" --memory huge
echo "train_offload: OK"
