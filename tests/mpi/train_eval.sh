#!/usr/bin/env bash
# Held-out evaluation during training, watched through the metrics file: 200 steps on a
# token file with --val-data and --eval-every 50 write 200 step lines and 4 validation
# losses (steps 50, 100, 150, 200), each line with exactly the fields of docs/watching.md;
# under --dp 2 --tp 2 the validation losses equal the serial run's (1e-5 relative, as the
# training losses do); --val-fraction holds out the end of --data (its windows are never
# trained on) and --eval-every 60 evaluates after steps 60, 120 and the last.
#   train_eval.sh <mpirun command...> <path to ndmesh>
source "$(dirname "$0")/train_lib.sh" "$@"
here=$(cd "$(dirname "$0")" && pwd)
python3 "$here/../support/make_tokens.py" "$tmp/train.bin" 40000 64 1
python3 "$here/../support/make_tokens.py" "$tmp/val.bin" 8000 64 2
model=(--data "$tmp/train.bin" --vocab 64 --layers 2 --hidden 32 --heads 4 --kv-heads 2 --seq 16 --batch 8
  --threads 1 --eval-batches 2 --warmup 10 --json)

"$ndmesh" train "${model[@]}" --steps 200 --val-data "$tmp/val.bin" --eval-every 50 --metrics "$tmp/serial.jsonl" \
  > "$tmp/serial.out" || fail "serial run: $(tail -3 "$tmp/serial.out")"
tail -n 1 "$tmp/serial.out" > "$tmp/serial.json"
[ "$(wc -l < "$tmp/serial.jsonl")" -eq 200 ] || fail "the metrics file has $(wc -l < "$tmp/serial.jsonl") lines, not 200"
jq -e -s 'map(.step) == [range(1; 201)]' "$tmp/serial.jsonl" > /dev/null || fail "the step lines are not steps 1..200"
jq -e -s '[.[] | select(has("val_loss")) | .step] == [50, 100, 150, 200]' "$tmp/serial.jsonl" > /dev/null ||
  fail "validation losses at $(jq -c -s '[.[] | select(has("val_loss")) | .step]' "$tmp/serial.jsonl"), not 50..200"
want='["step","loss","lr","grad_norm","tokens_per_second","mfu","peak_memory_bytes","elapsed_s"]'
jq -e -s --argjson want "$want" 'all(.[]; (keys_unsorted - ["val_loss"]) == $want)' "$tmp/serial.jsonl" > /dev/null ||
  fail "a metrics line has other fields: $(head -n 1 "$tmp/serial.jsonl")"
jq -e -s 'all(.[]; (.loss | type) == "number" and .lr > 0 and .grad_norm > 0 and .tokens_per_second > 0
  and .mfu == null and .peak_memory_bytes > 0 and .elapsed_s > 0)' "$tmp/serial.jsonl" > /dev/null ||
  fail "a metrics line has a bad value: $(head -n 1 "$tmp/serial.jsonl")"
# The metrics file and the report agree; the last evaluation is the final loss.
jq -e -n --slurpfile m "$tmp/serial.jsonl" --slurpfile r "$tmp/serial.json" '
  ($m | map(.loss)) == $r[0].losses and ($m | map(select(has("val_loss")) | .val_loss)) == $r[0].val_losses
  and $r[0].eval_steps == [50, 100, 150, 200] and $r[0].final_loss == $r[0].val_losses[-1]
  and ($r[0].val_data | startswith("tokens files='"$tmp"'/val.bin"))' > /dev/null ||
  fail "the metrics file and the report differ: $(jq -c '{eval_steps, val_losses, final_loss, val_data}' "$tmp/serial.json")"
# The held-out loss falls (the chain is learnable) and is not the training batch's.
jq -e '.val_losses[3] < .val_losses[0] - 0.1' "$tmp/serial.json" > /dev/null ||
  fail "the held-out loss did not fall: $(jq -c .val_losses "$tmp/serial.json")"
grep -q '^val_loss [0-9.]* at step 100 (2 batches of the held-out data)$' "$tmp/serial.out" ||
  fail "no held-out line at step 100: $(grep val_loss "$tmp/serial.out")"
[ "$(grep -c '^step [0-9]*/200 loss ' "$tmp/serial.out")" -eq 200 ] || fail "not 200 progress lines"

# dp 2 x tp 2: the same training and validation losses as the serial run.
"${mpirun[@]}" -np 4 "$ndmesh" train "${model[@]}" --steps 200 --dp 2 --tp 2 --val-data "$tmp/val.bin" --eval-every 50 \
  --metrics "$tmp/dptp.jsonl" > "$tmp/dptp.out" 2>&1 || fail "dp 2 x tp 2: $(tail -3 "$tmp/dptp.out")"
tail -n 1 "$tmp/dptp.out" > "$tmp/dptp.json"
expect_same "dp 2 x tp 2 with --val-data" "$tmp/serial.json" "$tmp/dptp.json"
rel=$(jq -n --slurpfile a "$tmp/serial.json" --slurpfile b "$tmp/dptp.json" '
  [$a[0].val_losses, $b[0].val_losses] | transpose | map((.[0] - .[1]) / .[0] | if . < 0 then -. else . end) | max')
echo "dp 2 x tp 2: validation losses within $rel of the serial run's"
jq -e -n --slurpfile b "$tmp/dptp.json" '$b[0].eval_steps == [50, 100, 150, 200]' > /dev/null || fail "dp 2 x tp 2: eval steps"
awk -v r="$rel" 'BEGIN{exit !(r <= 1e-5)}' || fail "dp 2 x tp 2: validation losses differ by $rel (> 1e-5)"
[ "$(wc -l < "$tmp/dptp.jsonl")" -eq 200 ] || fail "dp 2 x tp 2: the metrics file (rank 0's) has not 200 lines"

# Background checkpoints of dp 2 x tp 2 (every 50 steps, the last 2 kept): the one of step 100,
# written while steps 101.. ran, continues serially as the uninterrupted serial run does.
"${mpirun[@]}" -np 4 "$ndmesh" train "${model[@]}" --steps 200 --until 150 --dp 2 --tp 2 --save "$tmp/ck" \
  --save-every 50 --keep 2 > "$tmp/bg.out" 2>&1 || fail "dp 2 x tp 2 with --save-every: $(tail -3 "$tmp/bg.out")"
[ "$(jq .step "$tmp/ck.step-000100/manifest.json")" -eq 100 ] || fail "no background checkpoint of step 100"
"$ndmesh" train "${model[@]}" --steps 200 --val-data "$tmp/val.bin" --eval-every 50 --load "$tmp/ck.step-000100" \
  > "$tmp/resumed.out" || fail "resume of the background checkpoint: $(tail -3 "$tmp/resumed.out")"
tail -n 1 "$tmp/resumed.out" > "$tmp/resumed.json"
expect_same "dp 2 x tp 2's background checkpoint of step 100, resumed serially" "$tmp/serial.json" "$tmp/resumed.json" \
  --from 100

# --val-fraction: the end of --data held out; evaluations after 60, 120 and the last (150).
"$ndmesh" train "${model[@]}" --steps 150 --val-fraction 0.1 --eval-every 60 > "$tmp/frac.out" ||
  fail "--val-fraction run: $(tail -3 "$tmp/frac.out")"
tail -n 1 "$tmp/frac.out" | jq -e '.eval_steps == [60, 120, 150] and (.val_data | endswith("range=0.9..1"))
  and (.data | endswith("range=0..0.9"))' > /dev/null ||
  fail "--val-fraction: $(tail -n 1 "$tmp/frac.out" | jq -c '{eval_steps, data, val_data}')"
"${mpirun[@]}" -np 2 "$ndmesh" train "${model[@]}" --steps 150 --val-fraction 0.1 --eval-every 60 --cp 2 \
  > "$tmp/frac_cp.out" 2>&1 || fail "--val-fraction under cp 2: $(tail -3 "$tmp/frac_cp.out")"
rel=$(jq -n --slurpfile a <(tail -n 1 "$tmp/frac.out") --slurpfile b <(tail -n 1 "$tmp/frac_cp.out") '
  [$a[0].val_losses, $b[0].val_losses] | transpose | map((.[0] - .[1]) / .[0] | if . < 0 then -. else . end) | max')
awk -v r="$rel" 'BEGIN{exit !(r <= 1e-5)}' || fail "cp 2: held-out losses differ by $rel (> 1e-5)"
echo "train_eval.sh: ok"
