#!/usr/bin/env bash
# The virtual environment of the Hugging Face tests (hf_interop.sh, hf_tokenize.sh), made once
# under the build folder and shared by them: transformers 4.40, safetensors and tokenizers
# (a dependency of transformers) from PyPI, over the system interpreter's packages (Debian's
# torch). Sourced with VENV set; exits 77 (skipped) with the reason when it cannot be made.
python=/usr/bin/python3
[ -x "$python" ] || python=$(command -v python3)
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import transformers, safetensors, tokenizers" 2> /dev/null; then
  rm -rf "$VENV"
  "$python" -m venv --system-site-packages "$VENV" ||
    { echo "SKIPPED: $python cannot make a virtual environment (Debian: python3-venv)"; exit 77; }
  if ! "$VENV/bin/python" -m pip install -q --disable-pip-version-check "transformers==4.40.*" safetensors \
    > "$VENV.log" 2>&1; then
    rm -rf "$VENV"
    echo "SKIPPED: transformers 4.40 could not be installed from PyPI (offline?): $(tail -n 1 "$VENV.log")"
    exit 77
  fi
fi
