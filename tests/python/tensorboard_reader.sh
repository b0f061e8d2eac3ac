#!/usr/bin/env bash
# --tensorboard: TensorBoard's own event reader (the tensorboard package from PyPI, in a
# virtual environment made once under the build folder) reads the event files of a run,
# resumed once (a SessionLog START drops what the first file holds past the checkpoint),
# with the same numbers as its metrics file. Skipped (exit 77) when PyPI cannot be reached.
#   tensorboard_reader.sh <ndmesh> <venv folder>
set -euo pipefail
ndmesh=$1
venv=$2
here=$(cd "$(dirname "$0")" && pwd)
fail() { echo "FAIL: $*" >&2; exit 1; }
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import tensorboard" 2> /dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv" || { echo "SKIPPED: python3 cannot make a virtual environment (Debian: python3-venv)"; exit 77; }
  if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check tensorboard > "$venv.log" 2>&1; then
    rm -rf "$venv"
    echo "SKIPPED: the tensorboard package could not be installed from PyPI (offline?): $(tail -n 1 "$venv.log")"
    exit 77
  fi
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model=(--layers 1 --hidden 32 --heads 2 --kv-heads 1 --seq 16 --batch 4 --markov-vocab 16 --threads 1
  --eval-batches 2 --steps 30 --eval-every 10)
# A run killed after step 25 whose last checkpoint is step 20: the resumed run writes a new
# event file from step 21; TensorBoard must show steps 1..30 once, the resumed run's numbers.
"$ndmesh" train "${model[@]}" --until 25 --save "$tmp/ck" --save-every 20 --keep 2 --tensorboard "$tmp/tb" \
  --metrics "$tmp/m.jsonl" > /dev/null || fail "the first run"
"$ndmesh" train "${model[@]}" --load "$tmp/ck.step-000020" --tensorboard "$tmp/tb" --metrics "$tmp/m.jsonl" > /dev/null ||
  fail "the resumed run"
[ "$(ls "$tmp/tb" | grep -c tfevents)" -eq 2 ] || fail "want two event files: $(ls "$tmp/tb")"
# (The resumed run recomputes 21..25 with other wall times: compare its numbers, which the
# metrics file holds after its own append.)
"$venv/bin/python" "$here/tensorboard_reader.py" "$tmp/tb" "$tmp/m.jsonl" || fail "TensorBoard's reader disagrees"
echo "tensorboard_reader.sh: ok"
