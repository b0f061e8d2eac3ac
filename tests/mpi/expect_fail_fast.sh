#!/usr/bin/env bash
# Runs a job in which one rank fails its peers and checks that the job ends, non-zero,
# within twice the timeout of the moment the ranks reached the failure point.
#   expect_fail_fast.sh <timeout s> <expected message or -> <mpirun command...>
set -uo pipefail
timeout_s=$1
expected=$2
shift 2
# Start-up keeps a longer bound: wiring up 4 oversubscribed (sanitized) ranks can take
# longer than the few seconds the communication timeout is shortened to here.
out=$(NDMESH_TIMEOUT_S=$timeout_s NDMESH_INIT_TIMEOUT_S=120 "$@" 2>&1)
rc=$?
end=$(date +%s.%N)
echo "$out"
enter=$(echo "$out" | awk '/^enter /{print $2}' | sort -n | head -1)
if [ -z "$enter" ]; then echo "FAIL: no rank reached the failure point"; exit 1; fi
if [ "$rc" -eq 0 ]; then echo "FAIL: the job exited 0"; exit 1; fi
elapsed=$(awk -v a="$enter" -v b="$end" 'BEGIN{printf "%.2f", b - a}')
echo "job ended ${elapsed} s after the failure point (limit $((2 * timeout_s)) s), exit $rc"
if awk -v e="$elapsed" -v t="$timeout_s" 'BEGIN{exit !(e >= 2 * t)}'; then echo "FAIL: too slow"; exit 1; fi
if [ "$expected" != "-" ] && ! grep -qF -- "$expected" <<<"$out"; then
  echo "FAIL: the output lacks: $expected"
  exit 1
fi
echo "PASS"
