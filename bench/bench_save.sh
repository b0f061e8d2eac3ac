#!/usr/bin/env bash
# Background checkpoints: the wall time per step of a run saving every 10 steps (--save-every
# 10, each save copied and written by a thread while training goes on) against the same run
# without saves, as a ratio measured in one run of this script (goal: within 10%), the two
# interleaved over rounds so that a drift of the machine's load hits both alike. For scale,
# the time of one save made in the foreground (the final --save, after the loop: the
# process's wall time with it minus without it), i.e. what a step that saved would have
# waited before background saves.
#   bench/bench_save.sh <path of ndmesh> [steps] [rounds]
set -euo pipefail
ndmesh=$1
steps=${2:-40}
rounds=${3:-2}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model=(--layers 4 --hidden 256 --heads 8 --kv-heads 4 --seq 64 --batch 8 --markov-vocab 32 --threads 1 --eval-batches 0
  --warmup 2 --json)
now() { date +%s.%N; }
for round in $(seq "$rounds"); do
  "$ndmesh" train "${model[@]}" --steps "$steps" | tail -n 1 > "$tmp/none.$round"
  "$ndmesh" train "${model[@]}" --steps "$steps" --save "$tmp/ck" --save-every 10 | tail -n 1 > "$tmp/bg.$round"
  rm -rf "$tmp/ck"
  a=$(now); "$ndmesh" train "${model[@]}" --steps 1 > /dev/null; b=$(now)
  "$ndmesh" train "${model[@]}" --steps 1 --save "$tmp/ck1" > /dev/null; c=$(now)
  rm -rf "$tmp/ck1"
  awk -v a="$a" -v b="$b" -v c="$c" 'BEGIN{print (c - b) - (b - a)}' > "$tmp/fg.$round"
done
per_step() { jq -s "map(.seconds / $steps) | add / length" "$tmp/$1".*; }
none=$(per_step none) bg=$(per_step bg)
fg=$(cat "$tmp"/fg.* | awk '{s += $1} END {print s / NR}')
bytes=$(jq '.parameters * 12' "$tmp/none.1")
awk -v none="$none" -v bg="$bg" -v fg="$fg" -v bytes="$bytes" -v steps="$steps" -v rounds="$rounds" 'BEGIN{
  printf "4 layers hidden 256 seq 64 batch 8, 1 BLAS thread, %d steps, mean of %d rounds; a checkpoint of %.1f MiB\n",
         steps, rounds, bytes / 1048576
  printf "  wall time per step: no saves %.4f s, a background save every 10 steps %.4f s\n", none, bg
  printf "  background saves / no saves: %.3f (goal <= 1.10)\n", bg / none
  printf "  one save in the foreground: %.3f s (%.2f steps); every 10 steps that would be %.3f of the step time\n",
         fg, fg / none, 1 + fg / (10 * none)
}'
