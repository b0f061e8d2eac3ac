#!/usr/bin/env bash
# ndmesh eval: the loss of a checkpoint on the first tokens of a file, in order. Its number is
# the one training computes on the same window (a file of seq + 1 tokens holds one window, so
# the first loss of a resumed run is the checkpoint's loss on it), the same under --tp 2,
# --pp 2 and --dp 2; bad input (a file too short, a token outside the vocabulary, no
# checkpoint) is one line naming it with exit 2. A Hugging Face folder (export-hf of the
# checkpoint) read directly by eval --load and train --load gives the numbers of its
# import-hf checkpoint exactly, serially and under --tp 2.
#   eval.sh <ndmesh>
set -euo pipefail
ndmesh=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
py() { python3 -c "$@"; }
# llm.c shards: N tokens below 50 (seeded), and one with a token of 60.
tokens() {
  py "import struct, random, sys
random.seed($2); t = [random.randrange(50) for _ in range($1)] + ([60] if $3 else [])
open(sys.argv[1], 'wb').write(struct.pack('<256i', 20240520, 1, len(t), *([0] * 253)) + struct.pack('<%dH' % len(t), *t))" "$4"
}
tokens 17 1 0 "$tmp/one.bin"
tokens 257 2 0 "$tmp/long.bin"
tokens 40 3 1 "$tmp/bad.bin"
model=(--arch llama --layers 2 --hidden 32 --heads 4 --kv-heads 2 --vocab 50 --seq 16 --threads 1)
"$ndmesh" train "${model[@]}" --data "$tmp/long.bin" --batch 4 --steps 3 --until 2 --save "$tmp/ck" > /dev/null ||
  fail "train --save"

# The first loss of the resumed run on one.bin's single window is the checkpoint's loss on it.
"$ndmesh" train "${model[@]}" --data "$tmp/one.bin" --batch 2 --steps 3 --until 2 --save "$tmp/ck1" > /dev/null
resumed=$("$ndmesh" train "${model[@]}" --data "$tmp/one.bin" --batch 2 --steps 3 --load "$tmp/ck1" --json |
  tail -n 1 | py "import json, sys; print(json.load(sys.stdin)['losses'][0])")
evaluated=$("$ndmesh" eval --load "$tmp/ck1" --data "$tmp/one.bin" --seq 16 --batch 1 --batches 1 --json |
  py "import json, sys; j = json.load(sys.stdin); assert j['tokens'] == 16, j; print(j['loss'])")
py "a, b = $resumed, $evaluated; assert abs(a - b) <= 1e-6 * abs(a), (a, b)" ||
  fail "eval $evaluated differs from the resumed run's first loss $resumed"

# Every layout reads the same tokens: 4 batches of 4 x 16 = 256 tokens (+ 1).
serial=$("$ndmesh" eval --load "$tmp/ck" --data "$tmp/long.bin" --seq 16 --batch 4 --batches 4 --json)
py "import json, math; j = json.loads('$serial'); assert j['tokens'] == 256 and abs(j['perplexity'] - math.exp(j['loss'])) < 1e-9 * j['perplexity'], j"
declare -A layout
for flags in "--tp 2" "--pp 2" "--dp 2"; do
  # shellcheck disable=SC2086
  layout[$flags]=$(mpirun --allow-run-as-root --oversubscribe -np 2 "$ndmesh" eval --load "$tmp/ck" --data "$tmp/long.bin" \
    --seq 16 --batch 4 --batches 4 --threads 1 --json $flags)
  other=${layout[$flags]}
  py "import json; a, b = json.loads('$serial')['loss'], json.loads('$other')['loss']; assert abs(a - b) <= 1e-5 * a, (a, b)" ||
    fail "eval $flags: $other, serially $serial"
done

# --load HF_DIR: the folder read directly equals its import (and the checkpoint it was
# exported from: fp32 round trip), bit for bit, serially and under --tp 2 (each rank keeps
# its slice of the vocabulary, padded from 50 to 64 rows, and of every matrix).
"$ndmesh" checkpoint export-hf "$tmp/ck" "$tmp/hf" > /dev/null || fail "export-hf"
"$ndmesh" checkpoint import-hf "$tmp/hf" "$tmp/imp" > /dev/null || fail "import-hf"
ev=(--data "$tmp/long.bin" --seq 16 --batch 4 --batches 4 --threads 1 --json)
from_hf=$("$ndmesh" eval --load "$tmp/hf" "${ev[@]}")
from_import=$("$ndmesh" eval --load "$tmp/imp" "${ev[@]}")
[ "$from_hf" = "$from_import" ] || fail "eval --load HF_DIR: $from_hf, of its import $from_import"
from_hf=$(mpirun --allow-run-as-root --oversubscribe -np 2 "$ndmesh" eval --load "$tmp/hf" "${ev[@]}" --tp 2)
[ "$from_hf" = "${layout[--tp 2]}" ] || fail "eval --load HF_DIR --tp 2: $from_hf, of the checkpoint ${layout[--tp 2]}"
# train --load HF_DIR: no shape flags, a fresh run (step 0) on other data, as from the import.
first_loss() {
  "$ndmesh" train --load "$1" --data "$tmp/one.bin" --vocab 50 --seq 8 --batch 2 --steps 2 --threads 1 --json |
    tee "$tmp/train.out" | tail -n 1 | py "import json, sys; print(json.load(sys.stdin)['losses'])"
}
a=$(first_loss "$tmp/hf")
grep -q "starting from the weights of $tmp/hf (step 0, new optimizer state)" "$tmp/train.out" ||
  fail "train --load HF_DIR: $(head -n 5 "$tmp/train.out")"
b=$(first_loss "$tmp/imp")
[ "$a" = "$b" ] || fail "train --load HF_DIR losses $a, from its import $b"
text=$("$ndmesh" eval --load "$tmp/ck" --data "$tmp/long.bin" --seq 16 --batch 4 --batches 4)
echo "$text" | grep -q "perplexity .* over 256 tokens (4 batches of 4 x 16)" || fail "the text line: $text"

# Bad input: one line naming the file, exit 2.
expect_error() {
  local want=$1
  shift
  set +e
  "$ndmesh" eval "$@" > /dev/null 2> "$tmp/err"
  local rc=$?
  set -e
  [ "$rc" -eq 2 ] && [ "$(wc -l < "$tmp/err")" -eq 1 ] && grep -q -- "$want" "$tmp/err" ||
    fail "eval $*: exit $rc, want 2 and one line naming '$want': $(cat "$tmp/err")"
}
expect_error "one.bin holds 17" --load "$tmp/ck" --data "$tmp/one.bin" --seq 16 --batch 2 --batches 1
expect_error "bad.bin: token 60 at position 40" --load "$tmp/ck" --data "$tmp/bad.bin" --seq 8 --batch 5 --batches 1
expect_error "nowhere.ckpt" --load "$tmp/nowhere.ckpt" --data "$tmp/long.bin" --seq 16 --batch 4 --batches 1
expect_error "nothing.bin" --load "$tmp/ck" --data "$tmp/nothing.bin" --seq 16 --batch 4 --batches 1
expect_error "--batches" --load "$tmp/ck" --data "$tmp/long.bin" --seq 16 --batch 4 --batches 0
sed -i 's/"hidden_size": 32/"hidden_size": 33/' "$tmp/hf/config.json"
expect_error "config.json" --load "$tmp/hf" --data "$tmp/long.bin" --seq 16 --batch 4 --batches 1
echo "eval.sh: ok"
