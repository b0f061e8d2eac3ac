#!/usr/bin/env bash
# The main job of `make run`. For now: the groups and placement report of a sample 4D
# layout (16 ranks, 8 per node).
set -euo pipefail
build=${1:-build}
ndmesh="$build/bin/ndmesh"
echo "== ndmesh mesh --dp 2 --pp 2 --cp 2 --tp 2 --ranks-per-node 8 =="
"$ndmesh" mesh --dp 2 --pp 2 --cp 2 --tp 2 --ranks-per-node 8
