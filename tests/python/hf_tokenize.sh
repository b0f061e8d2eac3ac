#!/usr/bin/env bash
# `python -m ndmesh.data tokenize` with a tokenizer.json that the tokenizers package trains
# here on local text (hf_tokenize.py): the shards hold the tokenizer's ids, in both llm.c
# formats, and ndmesh train/eval read them. tokenizers comes from the Hugging Face tests'
# virtual environment (hf_venv.sh; skipped, exit 77, when PyPI cannot be reached).
#   hf_tokenize.sh <ndmesh> <venv folder> <folder holding the ndmesh Python package>
set -euo pipefail
ndmesh=$1
VENV=$2
pythonpath=$3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=hf_venv.sh
source "$here/hf_venv.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1
PYTHONPATH=$pythonpath "$VENV/bin/python" "$here/hf_tokenize.py" "$ndmesh" "$tmp"
