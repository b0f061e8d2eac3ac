#!/usr/bin/env bash
# Every command README.md and docs/*.md show runs and behaves as shown (doc_commands.py
# says how blocks are read and what "as shown" means).
#   doc_commands.sh <path to ndmesh>
exec python3 "$(dirname "$0")/doc_commands.py" "$@"
