#!/usr/bin/env bash
# leak_check_once.sh MARK COMMAND...: runs COMMAND; under the sanitizers (ASAN_OPTIONS with
# detect_leaks=1) only the first command of a test that passes the same MARK (a file path
# in the test's scratch folder) keeps LeakSanitizer's check at exit, later ones run without
# it (AddressSanitizer and UBSan stay on).
# Why (tests/mpi/train_lib.sh uses it for every multi-rank run): the check at each rank's
# exit is about half of a multi-rank run's CPU under the sanitizers (8 ranks of a 2-step
# run: 4.7 CPU-s with it, 2.2 without; it symbolises the allocations Open MPI keeps, which
# tests/sanitize/lsan.supp suppresses), and a test's later runs repeat the first one's code
# under other layouts. Serial runs keep the check.
set -euo pipefail
mark=$1
shift
if [[ ${ASAN_OPTIONS:-} == *detect_leaks=1* ]]; then
  if [ -e "$mark" ]; then
    export ASAN_OPTIONS=${ASAN_OPTIONS//detect_leaks=1/detect_leaks=0}
  else
    : > "$mark"
  fi
fi
exec "$@"
