#!/usr/bin/env bash
# The shape of the user docs (docs_structure.py says which rules), so that it cannot regress.
#   docs_structure.sh <ndmesh> (unused: the test reads the source tree)
exec python3 "$(dirname "$0")/docs_structure.py" "$(cd "$(dirname "$0")/../.." && pwd)"
