#!/usr/bin/env bash
# A Llama step against a GPT-2 step of the same parameter count, on the CPU, measured in the
# same run (the two interleaved, ROUNDS rounds, the median step time of each). GPT-2: 4
# blocks of hidden 256 (LayerNorm, GELU MLP of 4 hidden, biases, learned positions, tied
# head); Llama: the same sizes with RMSNorm, rotary positions, no biases, an untied head and a
# SwiGLU MLP of 8/3 hidden (682), which gives a block the GPT-2 block's 8 hidden^2 matrix
# weights. Both with 8 heads over 4 key/value heads, seq 256, batch 8, one BLAS thread.
#   bench/bench_llama.sh <path of ndmesh> [steps]
set -euo pipefail
ndmesh=$1
steps=${2:-6}
rounds=${ROUNDS:-3}
common=(--layers 4 --hidden 256 --heads 8 --kv-heads 4 --seq 256 --batch 8 --markov-vocab 64 --threads 1
  --eval-batches 0 --steps "$steps" --warmup 2 --json)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "llama vs gpt2 benchmark: 4 layers, hidden 256, 8 heads / 4 kv heads, seq 256, batch 8, $steps steps, $rounds rounds"
for ((r = 0; r < rounds; r++)); do
  "$ndmesh" train "${common[@]}" --arch gpt2 --ffn 1024 | tail -n 1 > "$tmp/gpt2.$r.json"
  "$ndmesh" train "${common[@]}" --arch llama --ffn 682 | tail -n 1 > "$tmp/llama.$r.json"
done
median() { jq -s "[.[].step_seconds] | sort | .[length / 2 | floor]" "$tmp/$1".*.json; }
params() { jq -s '.[0].parameters' "$tmp/$1".*.json; }
base=$(median gpt2)
for arch in gpt2 llama; do
  awk -v t="$(median $arch)" -v p="$(params $arch)" -v pb="$(params gpt2)" -v bt="$base" -v a="$arch" 'BEGIN{
    printf "  %-6s %d parameters (%.3f of gpt2)  step %.4f s  time ratio %.3f\n", a, p, p / pb, t, t / bt }'
done
