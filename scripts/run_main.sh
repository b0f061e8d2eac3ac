#!/usr/bin/env bash
# The main job of `make run`: the groups and placement report of a sample 4D layout
# (16 ranks, 8 per node), then `ndmesh check` on 8 local ranks for two 4D meshes
# (dp2 pp2 tp2 and pp2 cp2 tp2): every communicator is created and every group verified
# by communication; each check prints its summary with the set-up time. Last, data-parallel
# training on 8 local ranks (the loss approaching the Markov entropy rate), compared step
# by step with the same run in one process.
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
echo "== ndmesh launch -n 8 --no-tag -- ndmesh train --dp 8 --steps 300 --threads 1 --json =="
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$ndmesh" launch -n 8 --no-tag -- "$ndmesh" train --dp 8 --steps 300 --threads 1 --json | tee "$tmp/dp8.txt" |
  grep -v '^{' | awk '/^step /{n++; if (n % 50 != 0 && n > 3) next} {print}'
tail -n 1 "$tmp/dp8.txt" > "$tmp/dp8.json"
"$ndmesh" train --steps 300 --threads 1 --json | tail -n 1 > "$tmp/serial.json"
jq -rn --slurpfile p "$tmp/dp8.json" --slurpfile s "$tmp/serial.json" '
  ([$p[0].losses, $s[0].losses] | transpose | map((.[0] - .[1]) / .[1] | if . < 0 then -. else . end) | max) as $d |
  "the same run in one process: step 300 loss \($s[0].losses[-1] * 10000 | round / 10000), final loss \($s[0].final_loss * 10000 | round / 10000); " +
  "largest relative difference of the 300 per-step losses between dp 8 and serial: \($d)"'
