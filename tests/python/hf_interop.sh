#!/usr/bin/env bash
# Hugging Face interop against transformers itself (hf_interop.py): transformers 4.40 and
# safetensors from PyPI in a virtual environment made once under the build folder
# (hf_venv.sh, shared with hf_tokenize.sh), over
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
VENV=$venv
# shellcheck source=hf_venv.sh
source "$here/hf_venv.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 TRANSFORMERS_OFFLINE=1 HF_HUB_OFFLINE=1
"$venv/bin/python" "$here/hf_interop.py" "$ndmesh" "$tmp" "$mpirun"
