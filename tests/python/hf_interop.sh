#!/usr/bin/env bash
# Hugging Face interop against transformers itself (hf_interop.py): transformers 4.40 and
# safetensors from PyPI in a virtual environment made once under the build folder, over
# Debian's torch (/usr/bin/python3's, visible through --system-site-packages). Skipped
# (exit 77) with the reason when there is no torch or PyPI cannot be reached.
#   hf_interop.sh <ndmesh> <venv folder> [mpirun]
set -euo pipefail
ndmesh=$1
venv=$2
mpirun=${3:-}
here=$(cd "$(dirname "$0")" && pwd)
python=/usr/bin/python3
[ -x "$python" ] || python=$(command -v python3)
if ! "$python" -c "import torch" 2> /dev/null; then
  echo "SKIPPED: $python has no torch (Debian: python3-torch), which transformers needs"
  exit 77
fi
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import transformers, safetensors, torch" 2> /dev/null; then
  rm -rf "$venv"
  "$python" -m venv --system-site-packages "$venv" ||
    { echo "SKIPPED: $python cannot make a virtual environment (Debian: python3-venv)"; exit 77; }
  if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check "transformers==4.40.*" safetensors \
    > "$venv.log" 2>&1; then
    rm -rf "$venv"
    echo "SKIPPED: transformers 4.40 could not be installed from PyPI (offline?): $(tail -n 1 "$venv.log")"
    exit 77
  fi
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 TRANSFORMERS_OFFLINE=1 HF_HUB_OFFLINE=1
"$venv/bin/python" "$here/hf_interop.py" "$ndmesh" "$tmp" "$mpirun"
