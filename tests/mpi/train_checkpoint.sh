#!/usr/bin/env bash
# Checkpoint directories move between layouts: saved at step 8 of 16 under one dp x pp x
# cp x tp layout (pipelines, ZeRO, sequence parallelism, zigzag cp included), continued
# under others, steps 9..16 reproduce the uninterrupted serial run (1e-5 relative). The
# directory holds one shard file per (stage, tp rank), written by those ranks; a second
# save replaces the whole directory (no shard of the first is left); `ndmesh checkpoint
# inspect` reports the layout that wrote it.
#   train_checkpoint.sh <mpirun command...> <path to ndmesh>
source "$(dirname "$0")/train_lib.sh" "$@"
model=(--layers 4 --hidden 64 --heads 4 --kv-heads 2 --seq 32 --markov-vocab 32 --batch 8 --threads 1
  --eval-batches 0 --steps 16 --json)

"$ndmesh" train "${model[@]}" | tail -n 1 > "$tmp/serial.json" || fail "serial run"

# save <name> <ranks> <flags...>: trains to step 8 under the layout and saves $tmp/<name>.
save() {
  local name=$1 np=$2
  shift 2
  "${mpirun[@]}" -np "$np" "$ndmesh" train "${model[@]}" "$@" --until 8 --save "$tmp/$name" > "$tmp/$name.out" 2>&1 ||
    fail "save under $*: $(tail -5 "$tmp/$name.out")"
}
# resume <name> <ranks> <flags...>: continues $tmp/<name> under the layout to step 16.
resume() {
  local name=$1 np=$2
  shift 2
  "${mpirun[@]}" -np "$np" "$ndmesh" train "${model[@]}" "$@" --load "$tmp/$name" 2> "$tmp/resume.err" | tail -n 1 \
    > "$tmp/resumed.json" || fail "load of $name under $*: $(tail -5 "$tmp/resume.err")"
  [ "$(jq .first_step "$tmp/resumed.json")" -eq 9 ] || fail "$name under $* did not resume at step 9"
  expect_same "saved as $name, resumed under ${*:-serial} ($np ranks)" "$tmp/serial.json" "$tmp/resumed.json" \
    --from 8
}

# dp 2 x pp 2 x tp 2 with sequence parallelism: 4 shard files, one per stage and tp rank.
save a 8 --dp 2 --pp 2 --tp 2 --sequence-parallel --micro-batch 2
"$ndmesh" checkpoint inspect "$tmp/a" --json > "$tmp/a.json" || fail "inspect a"
jq -e '.layout.world == 8 and .layout.mesh == "dp=2,pp=2,cp=1,tp=2" and .layout.sequence_parallel and .step == 8
  and ([.files[].name] == ["shard-pp000-tp000.bin", "shard-pp000-tp001.bin", "shard-pp001-tp000.bin",
                           "shard-pp001-tp001.bin"])
  and ([.tensors[] | select(.name == "embed.tokens")] | length) == 1' "$tmp/a.json" > /dev/null ||
  fail "manifest of a: $(jq -c '{layout, files}' "$tmp/a.json")"
resume a 1
resume a 4 --pp 4 --micro-batch 2
resume a 4 --pp 2 --cp 2 --schedule interleaved --virtual-stages 2 --micro-batch 2
resume a 4 --dp 2 --tp 2 --zero 2

# dp 2 x cp 2 (zigzag) with ZeRO 1, untied head: one shard file; into a pipeline with tp.
model+=(--untied)
"$ndmesh" train "${model[@]}" | tail -n 1 > "$tmp/serial.json" || fail "serial run (untied)"
save b 4 --dp 2 --cp 2 --zero 1
jq -e '(.files | length) == 1 and .layout.zero == 1 and .layout.cp_layout == "zigzag" and
  .model.tied_embeddings == false' "$tmp/b/manifest.json" > /dev/null || fail "manifest of b"
resume b 4 --pp 2 --tp 2 --micro-batch 2
resume b 2 --pp 2 --schedule zb-h1 --micro-batch 2
# ZeRO 2 under a pipeline (moments gathered from the shards of each stage), into cp 2.
save c 4 --dp 2 --pp 2 --zero 2 --micro-batch 2
resume c 2 --cp 2

# A second save into the same directory replaces all of it.
save a 1
jq -e '.layout.world == 1 and (.files | length) == 1' "$tmp/a/manifest.json" > /dev/null ||
  fail "the second save did not replace the first: $(jq -c .files "$tmp/a/manifest.json")"
[ "$(ls "$tmp/a" | wc -l)" -eq 2 ] || fail "files of the first save left behind: $(ls "$tmp/a")"
[ -e "$tmp/.a.saving" ] && fail "temporary directory left behind"
echo "train_checkpoint.sh: ok"
