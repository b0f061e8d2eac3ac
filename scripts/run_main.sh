#!/usr/bin/env bash
# The main job of `make run`: the groups and placement report of a sample 4D layout
# (16 ranks, 8 per node), then `ndmesh check` on 8 local ranks for two 4D meshes
# (dp2 pp2 tp2 and pp2 cp2 tp2): every communicator is created and every group verified
# by communication; each check prints its summary with the set-up time. Last, 4D training
# (dp 2 x pp 2 x tp 2 with sequence parallelism) on 8 local ranks, the loss approaching the
# Markov entropy rate, compared step by step with the same run in one process. Another
# layout: edit `layout` below, e.g. (--pp 2 --cp 2 --tp 2) or (--dp 8).
set -euo pipefail
build=${1:-build}
ndmesh="$build/bin/ndmesh"
echo "== ndmesh mesh --dp 2 --pp 2 --cp 2 --tp 2 --ranks-per-node 8 =="
"$ndmesh" mesh --dp 2 --pp 2 --cp 2 --tp 2 --ranks-per-node 8
echo
echo "== ndmesh launch -n 8 -- ndmesh check --dp 2 --pp 2 --tp 2 --groups dp,pp,cp,tp,dp-cp,pp-dp,pp-tp =="
"$ndmesh" launch -n 8 -- "$ndmesh" check --dp 2 --pp 2 --tp 2 --groups dp,pp,cp,tp,dp-cp,pp-dp,pp-tp
echo
echo "== ndmesh launch -n 8 -- ndmesh check --pp 2 --cp 2 --tp 2 --groups dp,pp,cp,tp,dp-cp,pp-dp,pp-tp =="
"$ndmesh" launch -n 8 -- "$ndmesh" check --pp 2 --cp 2 --tp 2 --groups dp,pp,cp,tp,dp-cp,pp-dp,pp-tp
echo
# 4D training: dp 2 x pp 2 x tp 2 (sequence parallel, 1F1B over 4 micro-batches) on 8 ranks.
model=(--layers 4 --steps 300 --threads 1)
layout=(--dp 2 --pp 2 --tp 2 --sequence-parallel --micro-batch 2)
echo "== ndmesh launch -n 8 --no-tag -- ndmesh train ${layout[*]} ${model[*]} --json =="
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$ndmesh" launch -n 8 --no-tag -- "$ndmesh" train "${layout[@]}" "${model[@]}" --json | tee "$tmp/4d.txt" |
  grep -v '^{' | awk '/^step /{n++; if (n % 50 != 0 && n > 3) next} {print}'
tail -n 1 "$tmp/4d.txt" > "$tmp/4d.json"
echo
echo "== the same run in one process: ndmesh train ${model[*]} =="
"$ndmesh" train "${model[@]}" --json | tail -n 1 > "$tmp/serial.json"
jq -rn --slurpfile p "$tmp/4d.json" --slurpfile s "$tmp/serial.json" '
  ([$p[0].losses, $s[0].losses] | transpose | map((.[0] - .[1]) / .[1] | if . < 0 then -. else . end) | max) as $d |
  "layout \($p[0].layout | to_entries | map("\(.key)=\(.value)") | join(" ")) on \($p[0].world_size) ranks: " +
  "final loss \($p[0].final_loss * 10000 | round / 10000), \($p[0].tokens_per_second | round) tokens/s, " +
  "exposed gradient communication \($p[0].exposed_comm_seconds * 1000 | round) ms, pipeline bubble " +
  "\($p[0].pipeline.bubble_measured * 1000 | round / 10)% (simulated \($p[0].pipeline.bubble_simulated * 1000 | round / 10)%)\n" +
  "serial: final loss \($s[0].final_loss * 10000 | round / 10000), \($s[0].tokens_per_second | round) tokens/s\n" +
  "largest relative difference of the 300 per-step losses between the 4D run and serial: \($d)"'
