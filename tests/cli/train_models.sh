#!/usr/bin/env bash
# `ndmesh train`'s model description: --model presets changed by the flags given, --arch, the
# layer kinds' flags, the config file's [model] section, --load DIR taking the checkpoint's
# description, and bad input naming the flag, the value and the names it takes.
set -euo pipefail
ndmesh=${1:?usage: train_models.sh path/to/ndmesh}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
run=(--steps 2 --batch 4 --threads 1 --eval-batches 1 --warmup 0)

USAGE_LINES=1
source "$(dirname "$0")/../support/expect_usage.sh"

# A preset, as it is, and changed by a flag.
"$ndmesh" train --model llama-tiny "${run[@]}" > "$tmp/llama.txt"
grep -qF "model: 2 layers, hidden 64, heads 4/2 kv, ffn 160, seq 64, vocab 256" "$tmp/llama.txt" ||
  fail "llama-tiny: $(grep '^model' "$tmp/llama.txt")"
grep -qF "(untied head)" "$tmp/llama.txt" || fail "llama-tiny's head is tied: $(grep '^model' "$tmp/llama.txt")"
grep -qF "architecture: llama (llama-tiny): rmsnorm (eps 1e-05), swiglu MLP, rope positions (theta 500000), no biases" \
  "$tmp/llama.txt" || fail "llama-tiny: $(grep '^architecture' "$tmp/llama.txt")"
"$ndmesh" train --model llama-tiny --layers 1 --seq 32 --rope-theta 10000 "${run[@]}" > "$tmp/changed.txt"
grep -qF "model: 1 layers, hidden 64, heads 4/2 kv, ffn 160, seq 32, vocab 256" "$tmp/changed.txt" ||
  fail "llama-tiny --layers 1 --seq 32: $(grep '^model' "$tmp/changed.txt")"
grep -qF "rope positions (theta 10000)" "$tmp/changed.txt" || fail "--rope-theta: $(grep '^arch' "$tmp/changed.txt")"
"$ndmesh" train --model gpt2-tiny "${run[@]}" > "$tmp/gpt2.txt"
grep -qF "architecture: gpt2 (gpt2-tiny): layernorm (eps 1e-05), gelu MLP, learned positions, biases" "$tmp/gpt2.txt" ||
  fail "gpt2-tiny: $(grep '^architecture' "$tmp/gpt2.txt")"
# --arch over the default sizes, and one kind changed on its own.
"$ndmesh" train --arch llama --layers 1 --hidden 32 --heads 2 --seq 16 "${run[@]}" > "$tmp/arch.txt"
grep -qF "architecture: llama: rmsnorm" "$tmp/arch.txt" || fail "--arch llama: $(grep '^arch' "$tmp/arch.txt")"
grep -qF "ffn 256" "$tmp/arch.txt" || fail "--arch llama's default MLP width (8/3 of 32 up to 256): $(grep '^model' "$tmp/arch.txt")"
"$ndmesh" train --layers 1 --hidden 32 --heads 2 --seq 16 --norm rmsnorm --no-bias "${run[@]}" > "$tmp/custom.txt"
grep -qF "architecture: custom: rmsnorm (eps 1e-05), gelu MLP, learned positions, no biases" "$tmp/custom.txt" ||
  fail "--norm rmsnorm --no-bias: $(grep '^arch' "$tmp/custom.txt")"

# The config file's [model] keys, and a flag over them.
cat > "$tmp/llama.toml" << 'EOF'
[model]
arch = "llama"
layers = 1
hidden = 32
heads = 2
seq = 16
ffn = 64
vocab = 256
EOF
"$ndmesh" train --config "$tmp/llama.toml" "${run[@]}" > "$tmp/config.txt"
grep -qF "model: 1 layers, hidden 32, heads 2/2 kv, ffn 64, seq 16, vocab 256" "$tmp/config.txt" ||
  fail "[model] not trained: $(grep '^model' "$tmp/config.txt")"
grep -qF "architecture: llama:" "$tmp/config.txt" || fail "[model] arch: $(grep '^arch' "$tmp/config.txt")"
"$ndmesh" train --config "$tmp/llama.toml" --ffn 32 "${run[@]}" > "$tmp/config2.txt"
grep -qF "ffn 32," "$tmp/config2.txt" || fail "--ffn over [model]: $(grep '^model' "$tmp/config2.txt")"

# --load DIR alone continues with the checkpoint's description; a flag against it is refused.
small=(--arch llama --layers 1 --hidden 32 --heads 2 --ffn 64 --seq 16 --markov-vocab 16)
"$ndmesh" train "${small[@]}" --steps 4 --until 2 --batch 4 --threads 1 --eval-batches 1 --json --save "$tmp/ck" |
  tail -n 1 > /dev/null
"$ndmesh" train "${small[@]}" --steps 4 --batch 4 --threads 1 --eval-batches 1 --json --load "$tmp/ck" |
  tail -n 1 > "$tmp/flags.json"
"$ndmesh" train --markov-vocab 16 --steps 4 --batch 4 --threads 1 --eval-batches 1 --json --load "$tmp/ck" \
  > "$tmp/alone.txt"
grep -qF "architecture: llama: rmsnorm" "$tmp/alone.txt" || fail "--load alone: $(grep '^arch' "$tmp/alone.txt")"
tail -n 1 "$tmp/alone.txt" > "$tmp/alone.json"
jq -e -n --slurpfile a "$tmp/flags.json" --slurpfile b "$tmp/alone.json" '$a[0].losses == $b[0].losses' > /dev/null ||
  fail "--load alone trains other losses than --load with the model flags"
expect_usage "norm: checkpoint has rmsnorm, the run has layernorm" "$ndmesh" train --arch gpt2 --markov-vocab 16 --steps 4 \
  --batch 4 --threads 1 --load "$tmp/ck"

# Bad input: one line naming the flag, the value and the names it takes.
expect_usage "--model 'gpt5' is not a preset; use one of" "$ndmesh" train --model gpt5
expect_usage "--arch=mamba is not a model family; use gpt2 or llama" "$ndmesh" train --arch mamba
expect_usage "--norm=batchnorm is not a norm; use layernorm (GPT-2) or rmsnorm (Llama)" "$ndmesh" train --norm batchnorm
expect_usage "--mlp=relu is not an MLP kind" "$ndmesh" train --mlp relu
expect_usage "--positions=alibi is not a kind of positions" "$ndmesh" train --positions alibi
expect_usage "the data (markov vocab=300" "$ndmesh" train --model llama-tiny --markov-vocab 300 --steps 1
expect_usage "has a vocabulary of 256; give --vocab 300" "$ndmesh" train --model llama-tiny --markov-vocab 300 --steps 1
expect_usage "--rope-theta=0 must be positive; e.g. --rope-theta=10000" "$ndmesh" train --arch llama --rope-theta 0
expect_usage "rotary positions need an even head size, but --hidden / --heads = 3" "$ndmesh" train --arch llama --hidden 24 --heads 8 \
  --kv-heads 8
expect_usage "--norm-eps=-1 must be a positive number" "$ndmesh" train --norm-eps -1
echo "train_models.sh: ok"
