#!/usr/bin/env bash
# Load balancing of a mixture of experts: moe-tiny (2 MoE blocks of 4 SwiGLU experts, top-2)
# trains 200 steps on the Markov source (batch 4, seed 1) four ways: the softmax router with the
# auxiliary loss (--aux-loss 0.01) and without it (0), and the sigmoid router with its
# balancing bias (router_bias_rate 0.001, --aux-loss 0) and without it (rate 0). Prints, per
# run, the final loss and, over steps 151-200, the mean coefficient of variation of the
# tokens per expert (std / mean over a block's 4 experts) and the mean max / mean load; exits 1
# when a balanced run is not more even than its unbalanced twin.
#   scripts/moe_balance.sh [path to ndmesh]
set -euo pipefail
ndmesh=${1:-build/bin/ndmesh}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
run=(--model moe-tiny --steps 200 --batch 4 --threads 1 --eval-batches 1 --json)
# The sigmoid router's bias rate is a [model] key (no flag): a config with moe-tiny's description.
write_config() {  # write_config <file> <router_bias_rate>
  printf '[model]\narch = "llama"\nlayers = 2\nhidden = 64\nheads = 4\nkv_heads = 2\nffn = 160\nseq = 64\n%s\n' \
    'vocab = 256' > "$1"
  printf 'experts = 4\ntop_k = 2\nexpert_ffn = 64\nrouter = "sigmoid"\naux_loss = 0.0\nrouter_bias_rate = %s\n' "$2" >> "$1"
}
write_config "$tmp/bias.toml" 0.001
write_config "$tmp/nobias.toml" 0.0
"$ndmesh" train "${run[@]}" --aux-loss 0.01 | tail -n 1 > "$tmp/softmax_aux.json"
"$ndmesh" train "${run[@]}" --aux-loss 0 | tail -n 1 > "$tmp/softmax_none.json"
"$ndmesh" train "${run[@]}" --config "$tmp/bias.toml" | tail -n 1 > "$tmp/sigmoid_bias.json"
"$ndmesh" train "${run[@]}" --config "$tmp/nobias.toml" | tail -n 1 > "$tmp/sigmoid_none.json"
python3 - "$tmp" << 'PY'
import json, statistics, sys
tmp = sys.argv[1]
cv = {}
for name in ["softmax_aux", "softmax_none", "sigmoid_bias", "sigmoid_none"]:
    d = json.load(open(f"{tmp}/{name}.json"))
    cvs, peaks = [], []
    for row in d["expert_loads"][150:]:
        for b in range(0, len(row), 4):
            x = row[b:b + 4]
            m = sum(x) / len(x)
            cvs.append(statistics.pstdev(x) / m)
            peaks.append(max(x) / m)
    cv[name] = sum(cvs) / len(cvs)
    print(f"{name}: final loss {d['losses'][-1]:.4f}, load CV {cv[name]:.3f}, max/mean {sum(peaks) / len(peaks):.3f} "
          f"(steps 151-200)")
bad = [(a, b) for a, b in [("softmax_aux", "softmax_none"), ("sigmoid_bias", "sigmoid_none")] if not cv[a] < cv[b]]
for a, b in bad:
    print(f"FAIL: {a}'s load (CV {cv[a]:.3f}) is not more even than {b}'s ({cv[b]:.3f})")
sys.exit(1 if bad else 0)
PY
