#!/usr/bin/env bash
# The ctest fixture of the multi-node tests.
#   fixture.sh setup    removes clusters (namespaces, processes, state) left behind by a run
#                       that was killed before its teardown
#   fixture.sh cleanup  the same after the last test, and fails if a test left one behind
# Both exit 77 with the reason where the harness cannot run (not root, no namespaces).
set -uo pipefail
source "$(dirname "$0")/harness.sh"
reason=$(mn_probe) || {
  echo "$reason"
  exit 77
}
removed=$(mn_cleanup)
[ -n "$removed" ] && echo "$removed"
case ${1:-} in
  setup) exit 0 ;;
  cleanup)
    [ -z "$removed" ] || { echo "FAIL: a multi-node test left a cluster behind (removed now)"; exit 1; }
    left=$(mn_leftovers)
    [ -z "$left" ] || echo "clusters still owned by running processes (left alone): $left"
    echo "no cluster left behind"
    ;;
  *) echo "usage: fixture.sh setup|cleanup" >&2; exit 2 ;;
esac
