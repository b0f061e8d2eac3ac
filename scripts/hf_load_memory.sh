#!/usr/bin/env bash
# `ndmesh eval --load HF_DIR` of a GPT-2 124M-shaped folder (random weights: ndmesh trains one
# step and exports it) serially, under --tp 2 and under --pp 2: each rank's peak resident
# memory (/usr/bin/time's maximum resident set size) and the loss, for each ndmesh given (e.g.
# main's build before the slice reader and this branch's). Each layout's result must be the
# same bit for bit for every ndmesh given. Not part of make test (a 500 MB folder); quoted in the issue notes.
#   scripts/hf_load_memory.sh <ndmesh> [<another ndmesh> ...]
# Environment: LAYERS (12), MPIRUN (default mpirun), WORK (a folder to keep the files in).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: scripts/hf_load_memory.sh <ndmesh> [<another ndmesh> ...]" >&2; exit 2; }
work=${WORK:-$(mktemp -d)}
[ -n "${WORK:-}" ] || trap 'rm -rf "$work"' EXIT
mkdir -p "$work"
first=$(realpath "$1")
model=(--arch gpt2 --layers "${LAYERS:-12}" --hidden 768 --heads 12 --kv-heads 12 --vocab 50257 --threads 1)
python3 -c "import struct, random, sys
random.seed(3); t = [random.randrange(50257) for _ in range(2 * 64 + 1)]
open(sys.argv[1], 'wb').write(struct.pack('<256i', 20240520, 1, len(t), *([0] * 253)) + struct.pack('<%dH' % len(t), *t))" \
  "$work/tok.bin"
if [ ! -d "$work/hf" ]; then
  "$first" train "${model[@]}" --seq 64 --data "$work/tok.bin" --batch 1 --steps 1 --save "$work/ck" > /dev/null
  "$first" checkpoint export-hf "$work/ck" "$work/hf" > /dev/null
fi
echo "folder: $(du -b "$work/hf/model.safetensors" | cut -f1) bytes of safetensors"
ev=(--load "$work/hf" --data "$work/tok.bin" --seq 64 --batch 2 --batches 1 --threads 1 --json)
declare -A want
status=0
for bin in "$@"; do
  bin=$(realpath "$bin")
  for layout in serial "--tp 2" "--pp 2"; do
    if [ "$layout" = serial ]; then
      out=$(/usr/bin/time -f "peak %M KiB" "$bin" eval "${ev[@]}" 2> "$work/time")
    else
      # shellcheck disable=SC2086
      out=$("${MPIRUN:-mpirun}" --allow-run-as-root --oversubscribe -np 2 /usr/bin/time -f "peak %M KiB" \
        "$bin" eval "${ev[@]}" $layout 2> "$work/time")
    fi
    peaks=$(grep -o 'peak [0-9]* KiB' "$work/time" | awk '{ printf "%s%.0f MiB", n++ ? ", " : "", $2 / 1024 }')
    echo "$bin eval ${layout}: peak resident per rank ${peaks}; $out"
    got=$(echo "$out" | tail -n 1)
    [ -n "${want[$layout]:-}" ] || want[$layout]=$got
    [ "$got" = "${want[$layout]}" ] || { echo "FAIL: eval ${layout} differs: $got, not ${want[$layout]}" >&2; status=1; }
  done
done
[ "$status" != 0 ] || echo "each layout's result is the same for every ndmesh"
exit "$status"
