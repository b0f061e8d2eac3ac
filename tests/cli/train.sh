#!/usr/bin/env bash
# `ndmesh train`: one progress line per step, a JSON summary as the last line, exact
# resume from a checkpoint through the command line, byte-level data, and bad input
# (flags, files, environment) exiting 2 with a message naming the flag and the value.
set -euo pipefail
ndmesh=${1:?usage: train.sh path/to/ndmesh}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# --warmup 2: the cosine schedule (which spans --steps) shapes every step after the second.
small=(--layers 1 --hidden 32 --heads 2 --kv-heads 1 --seq 16 --batch 4 --markov-vocab 16 --threads 1 --eval-batches 2
  --warmup 2)

# Plain lines (stdout is not a terminal): one per step, then the summary, JSON last.
"$ndmesh" train "${small[@]}" --steps 12 --json > "$tmp/full.txt"
[ "$(grep -c '^step [0-9]*/12 loss ' "$tmp/full.txt")" -eq 12 ] || fail "expected 12 progress lines"
grep -q 'tok/s' "$tmp/full.txt" && grep -q 'eta' "$tmp/full.txt" || fail "progress lines lack tok/s or eta"
grep -q '^entropy rate ' "$tmp/full.txt" || fail "no entropy rate in the summary"
last=$(tail -n 1 "$tmp/full.txt")
echo "$last" | jq -e '(.final_loss | type == "number") and (.entropy_rate | type == "number")
  and (.tokens_per_second > 0) and .steps == 12' > /dev/null || fail "bad JSON summary: $last"
# The entropy rate of a 16-state chain is below ln 16.
echo "$last" | jq -e '.entropy_rate > 0 and .entropy_rate < 2.7726' > /dev/null || fail "entropy rate out of range"

# Stop at step 6 of a 12-step run and save, continue to 12: steps 7..12 print the same
# losses as the uninterrupted run.
"$ndmesh" train "${small[@]}" --steps 12 --until 6 --save "$tmp/ck.bin" > "$tmp/first.txt"
diff <(grep -o '^step [0-9]*/[0-9]* loss [0-9.]*' "$tmp/full.txt" | head -n 6 | sed 's|/12||') \
     <(grep -o '^step [0-9]*/[0-9]* loss [0-9.]*' "$tmp/first.txt" | sed 's|/6||') || fail "first half differs"
[ -f "$tmp/ck.bin/manifest.json" ] || fail "no checkpoint directory written"
[ -e "$tmp/.ck.bin.saving" ] && fail "temporary checkpoint directory left behind"
"$ndmesh" train "${small[@]}" --steps 12 --load "$tmp/ck.bin" > "$tmp/rest.txt"
diff <(grep -o '^step [0-9]*/12 loss [0-9.]*' "$tmp/full.txt" | tail -n 6) \
     <(grep -o '^step [0-9]*/12 loss [0-9.]*' "$tmp/rest.txt") || fail "resumed losses differ from the full run"

# ndmesh checkpoint inspect: the manifest, readable and as JSON; --verify reads every slice.
"$ndmesh" checkpoint inspect "$tmp/ck.bin" --verify > "$tmp/inspect.txt" || fail "inspect --verify failed"
grep -q "^step 6 (AdamW step 6)" "$tmp/inspect.txt" || fail "inspect: no step line: $(cat "$tmp/inspect.txt")"
grep -q "^verified: .* every slice matches its checksum" "$tmp/inspect.txt" || fail "inspect: not verified"
"$ndmesh" checkpoint inspect "$tmp/ck.bin" --json | jq -e '.format == "ndmesh checkpoint" and .version == 3
  and .step == 6 and .data.position == 6 and .layout.world == 1 and .model.layers == 1
  and ([.tensors[] | select(.name == "embed.tokens")] | length) == 1
  and ([.files[].bytes] | add) > 0' > /dev/null || fail "inspect --json"
# A corrupt slice, a truncated shard and a missing manifest are named.
cp -r "$tmp/ck.bin" "$tmp/bad.ckpt"
shard=$(ls "$tmp/bad.ckpt" | grep '^shard-' | head -n 1)
printf '\xff\xff\xff\xff' | dd of="$tmp/bad.ckpt/$shard" bs=1 seek=100 conv=notrunc status=none
set +e
"$ndmesh" checkpoint inspect "$tmp/bad.ckpt" --verify > "$tmp/out.txt" 2>&1
rc=$?
set -e
[ "$rc" -eq 1 ] && grep -q "$shard' is corrupt" "$tmp/out.txt" || fail "inspect --verify of a corrupt shard: rc $rc $(cat "$tmp/out.txt")"

# A single-file checkpoint (format 2) written by the ndmesh before checkpoint directories
# (tests/data/format2_step6.ckpt: --until 6 of the run below): train refuses it with the
# conversion command; converted, it continues with the uninterrupted run's losses. The file was
# written at --lr 3e-3, the default of its time.
legacy=(--layers 1 --hidden 16 --heads 2 --kv-heads 1 --seq 8 --markov-vocab 8 --batch 4 --threads 1 --steps 12
        --lr 3e-3)
legacy_file="$(dirname "$0")/../data/format2_step6.ckpt"
"$ndmesh" train "${legacy[@]}" > "$tmp/legacy_full.txt"
set +e
"$ndmesh" train "${legacy[@]}" --load "$legacy_file" > "$tmp/legacy_refused.txt" 2>&1
rc=$?
set -e
[ "$rc" -eq 2 ] && grep -q "ndmesh checkpoint convert" "$tmp/legacy_refused.txt" ||
  fail "a format-2 file given to --load: rc $rc $(cat "$tmp/legacy_refused.txt")"
"$ndmesh" checkpoint convert "$legacy_file" "$tmp/legacy.ckpt" > /dev/null || fail "checkpoint convert"
"$ndmesh" checkpoint inspect "$tmp/legacy.ckpt" --verify > /dev/null || fail "the converted checkpoint does not verify"
"$ndmesh" train "${legacy[@]}" --load "$tmp/legacy.ckpt" > "$tmp/legacy_rest.txt" ||
  fail "the converted format-2 checkpoint does not load"
diff <(grep -o '^step [0-9]*/12 loss [0-9.]*' "$tmp/legacy_full.txt" | tail -n 6) \
     <(grep -o '^step [0-9]*/12 loss [0-9.]*' "$tmp/legacy_rest.txt") || fail "format-2 resume differs from the full run"

# A long run holds a bounded pipeline trace (the last --trace-steps steps of actions): 64
# micro-batches per step, 2000 steps against 200, the peak RSS must not grow by more than
# noise (measured: +0.24 MiB; before the window, +15 MiB).
rss=(--layers 1 --hidden 8 --heads 1 --kv-heads 1 --seq 4 --markov-vocab 8 --threads 1 --eval-batches 0 --batch 64
  --micro-batch 1 --steps 1000000 --json)
short=$("$ndmesh" train "${rss[@]}" --until 200 | tail -n 1 | jq .memory_bytes.peak_rss)
long=$("$ndmesh" train "${rss[@]}" --until 2000 | tail -n 1 | jq .memory_bytes.peak_rss)
echo "peak RSS: 200 steps $short B, 2000 steps $long B"
awk -v a="$short" -v b="$long" 'BEGIN{exit !(b - a < 2 * 1048576)}' ||
  fail "the peak RSS grows with the steps: $short B after 200, $long B after 2000"

# Byte-level data on a text file (the vocabulary becomes 256).
for i in $(seq 1 50); do echo "the quick brown fox jumps over the lazy dog $i"; done > "$tmp/text.txt"
"$ndmesh" train --data "$tmp/text.txt" --layers 1 --hidden 32 --heads 2 --seq 32 --batch 2 --steps 3 --threads 1 \
  --eval-batches 1 --json | tail -n 1 | jq -e '.entropy_rate == null and .final_loss > 0' > /dev/null \
  || fail "byte-level run"

# Bad input: exit 2, and the message names the flag (or variable) and the value.
source "$(dirname "$0")/../support/expect_usage.sh"
expect_usage "--layers=0" "$ndmesh" train --layers 0
expect_usage "--heads=4 is not a multiple of --kv-heads=3; use --kv-heads=2 or --kv-heads=4" "$ndmesh" train --kv-heads 3
expect_usage "--hidden=64 is not divisible by --heads=3; use --heads=2 or --heads=4" "$ndmesh" train --heads 3
expect_usage "--layers=0 must be positive; e.g. --layers=1" "$ndmesh" train --layers 0
expect_usage "--vocab=1 must be at least 2" "$ndmesh" train --vocab 1
expect_usage "--lr=-1" "$ndmesh" train --lr -1
expect_usage "--vocab=50" "$ndmesh" train --vocab 50
expect_usage "--data=$tmp/missing.txt" "$ndmesh" train --data "$tmp/missing.txt"
expect_usage "--layers=abc is not a whole number; e.g. --layers 2" "$ndmesh" train --layers abc
expect_usage "--lr=fast is not a number; e.g. --lr 0.0006" "$ndmesh" train --lr fast
expect_usage "--zero3-prefetch=maybe is not true or false" "$ndmesh" train --zero3-prefetch maybe
expect_usage "--untied=maybe is not true or false; give the flag alone (--untied)" "$ndmesh" train --untied=maybe
# A flag given a count: CLI11 would take --json=3 as --json given three times.
expect_usage "--json=3 is not true or false; give the flag alone (--json) or leave it out" "$ndmesh" train --json=3
expect_usage "--sequence-parallel=2 is not true or false" "$ndmesh" train --tp 2 --sequence-parallel=2
expect_usage "--json=1 is not true or false" "$ndmesh" plan memory --model gpt2-124m --json=1
expect_usage "NDMESH_THREADS='many'" env NDMESH_THREADS=many "$ndmesh" train
head -c 100 /dev/urandom > "$tmp/junk.bin"
expect_usage "not an ndmesh checkpoint" "$ndmesh" train "${small[@]}" --steps 12 --load "$tmp/junk.bin"
expect_usage "hidden: checkpoint has 32, the run has 64" "$ndmesh" train --layers 1 --hidden 64 --heads 2 \
  --kv-heads 1 --seq 16 --batch 4 --markov-vocab 16 --threads 1 --steps 12 --load "$tmp/ck.bin"
expect_usage "already at step 6" "$ndmesh" train "${small[@]}" --steps 6 --load "$tmp/ck.bin"
expect_usage "--batch=100000 --seq=64 with this model and layout needs about" "$ndmesh" train --batch 100000
expect_usage "--until=13" "$ndmesh" train --steps 12 --until 13
expect_usage "--steps=-1 must be at least 1" "$ndmesh" train --steps -1
expect_usage "--replica-id=2 belongs to an elastic run; add --coordinator" "$ndmesh" train --replica-id 2
expect_usage "--save-every=4 needs --save" "$ndmesh" train --save-every 4
expect_usage "--data is empty" "$ndmesh" train --data ""
expect_usage "--recompute=partial is not a recompute mode (none, selective, full)" "$ndmesh" train --recompute partial
expect_usage "--recompute= is not a recompute mode" "$ndmesh" train --recompute ""
expect_usage "--zero=5 is not a ZeRO stage ndmesh train runs" "$ndmesh" train --zero 5
# --grad-dtype bf16 rounds and widens its buckets on the device with --device cuda, and ZeRO-3
# runs with --precision bf16 there (each product rounds its gathered weight): neither refused
# (here, without a GPU, the one line says why CUDA cannot run; with one, it trains).
for flags in "--grad-dtype bf16" "--precision bf16 --grad-dtype bf16 --zero 3"; do
  set +e
  # shellcheck disable=SC2086 # the flags are words
  "$ndmesh" train "${small[@]}" --steps 1 --device cuda $flags > "$tmp/out.txt" 2>&1
  rc=$?
  set -e
  ! grep -qE -- "--(grad-dtype|precision|zero)" "$tmp/out.txt" || fail "$flags refused with --device cuda: $(cat "$tmp/out.txt")"
  [ "$rc" -eq 0 ] || { [ "$(wc -l < "$tmp/out.txt")" -eq 1 ] &&
    grep -qE '\[cuda\] (no usable CUDA GPU here|the CUDA driver sees no GPU|this ndmesh was built without CUDA)' "$tmp/out.txt"; } ||
    fail "--device cuda $flags: exit $rc without the one [cuda] line: $(cat "$tmp/out.txt")"
done
expect_usage "--kernel-times with --device=cpu: it times the GPU's kernels; add --device cuda" "$ndmesh" train --kernel-times
expect_usage "--save is empty" "$ndmesh" train --save ""
expect_usage "--load is empty" "$ndmesh" train --load ""
expect_usage "not a regular file" "$ndmesh" train --data "$tmp"
expect_usage "not a regular file" "$ndmesh" train --data /dev/zero
expect_usage "'$tmp' has no manifest.json" "$ndmesh" train --load "$tmp"
expect_usage "--load=/dev/zero: not a checkpoint directory or file" "$ndmesh" train --load /dev/zero
expect_usage "$shard' is corrupt: the slice of" "$ndmesh" train "${small[@]}" --steps 12 --load "$tmp/bad.ckpt"
truncate -s 10 "$tmp/bad.ckpt/$shard"
expect_usage "$shard' has 10 bytes but the manifest says" "$ndmesh" train "${small[@]}" --steps 12 --load "$tmp/bad.ckpt"
rm "$tmp/bad.ckpt/manifest.json"
expect_usage "has no manifest.json: it is not a checkpoint, or an incomplete one" "$ndmesh" checkpoint inspect "$tmp/bad.ckpt"
expect_usage "does not exist or is not writable" "$ndmesh" train --save /nonexistent/dir/run.ckpt
expect_usage "--save=$tmp: is a directory that is not an ndmesh checkpoint" "$ndmesh" train --save "$tmp"
expect_usage "--save=$tmp/junk.bin: is a file" "$ndmesh" train --save "$tmp/junk.bin"
expect_usage "the name is too long" "$ndmesh" train --save "$tmp/$(printf 'a%.0s' $(seq 1 240))"
echo "train.sh: ok"
