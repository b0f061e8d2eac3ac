#!/usr/bin/env bash
# The main job of `make run`: the groups and placement report of a sample 4D layout
# (16 ranks, 8 per node), then `ndmesh check` on 8 local ranks for two 4D meshes
# (dp2 pp2 tp2 and pp2 cp2 tp2): every communicator is created and every group verified
# by communication; each check prints its summary with the set-up time.
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
