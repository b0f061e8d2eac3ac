#!/usr/bin/env bash
# Checkpoints on node-local disks (tests/multinode/harness.sh --private: the checkpoint
# folder is a different disk on each node). A save whose shard writers sit on both nodes
# fails naming the file and the rank and node that wrote it, and the previous checkpoint
# stays whole: when node1 lacks the folder rank 0 prepared, its writers say so; when node1
# has one (left by a job whose rank 0 ran there), they write into it and rank 0's check
# before the commit finds their files missing. A save whose writers all sit on node0 works
# (docs/multinode.md: a multi-node save needs a shared file system).
#   checkpoint.sh <path to ndmesh>
source "$(dirname "$0")/mn_lib.sh" "$@"
export NDMESH_TIMEOUT_S=60
disk="$tmp/disk"  # the same path on every node, a different disk behind it on each
mn_cluster c --nodes 2 --ranks 2 --private "$disk"
model=(--layers 2 --hidden 32 --heads 4 --kv-heads 2 --seq 16 --markov-vocab 16 --threads 1 --eval-batches 0 --batch 8)
node_disk() { echo "$MN_STATE/$c/disks/node$1/private"; }

# dp 2 x tp 2: the writers (dp rank 0 of each tp rank) are ranks 0 and 1, both on node0.
out=$(mn_mpirun "$c" -np 4 "$ndmesh" train "${model[@]}" --dp 2 --tp 2 --steps 2 --save "$disk/run.ckpt" 2>&1) ||
  fail "a save with every writer on node0 failed: $out"
[ -f "$(node_disk 0)/run.ckpt/manifest.json" ] || fail "no checkpoint on node0's disk"
before=$(md5sum < "$(node_disk 0)/run.ckpt/manifest.json")

# failing_save <what> <expected line (extended regex)>: a pp 2 x tp 2 save (stage 1's
# writers are ranks 2 and 3, on node1) must fail saying so.
failing_save() {
  local out rc
  out=$(mn_mpirun "$c" -np 4 "$ndmesh" train "${model[@]}" --pp 2 --tp 2 --steps 4 --save "$disk/run.ckpt" 2>&1)
  rc=$?
  echo "$out" | grep -v '^step' | tail -n 6
  [ "$rc" -ne 0 ] || fail "$1: the save succeeded"
  grep -qE "$2" <<<"$out" || fail "$1: no line saying why"
}
saving="$disk/\.run\.ckpt\.saving/shard-pp001-tp00[01]\.bin"
# node1 lacks the folder rank 0 prepared.
failing_save "node-local disks" "\[rank [23]\] \[checkpoint\] cannot create '$saving' on node1: the folder does not exist here.*a multi-node save needs a shared file system"
# A folder left on node1's disk: the writers succeed there, rank 0 finds their files
# missing on its own disk before it commits.
mkdir -p "$(node_disk 1)/.run.ckpt.saving"
failing_save "a stale folder on node1" "\[rank 0\] \[checkpoint\] '$saving' is missing on node0, where the manifest is written, but rank [23] on node1 wrote it.*shared file system; the previous checkpoint is kept"
[ -f "$(node_disk 1)/.run.ckpt.saving/shard-pp001-tp000.bin" ] || fail "the writers on node1 did not write"

# The previous checkpoint is untouched and whole, and training resumes from it (on node0,
# the only disk that has it).
[ "$(md5sum < "$(node_disk 0)/run.ckpt/manifest.json")" = "$before" ] || fail "the failed saves changed the manifest"
mn_enter "$c" 0 "$ndmesh" checkpoint inspect "$disk/run.ckpt" --verify > /dev/null ||
  fail "the previous checkpoint does not verify"
out=$(mn_enter "$c" 0 "$ndmesh" train "${model[@]}" --steps 4 --load "$disk/run.ckpt" --json 2>&1) ||
  fail "the previous checkpoint does not load: $out"
[ "$(tail -n 1 <<<"$out" | jq .first_step)" = 3 ] || fail "not resumed after step 2: $(tail -n 1 <<<"$out")"
echo "checkpoint.sh: ok"
