#!/usr/bin/env bash
# One NDMESH_INIT_TIMEOUT_S bounds a store launch's whole start-up (connect, arrive, the
# Gloo world), not one per phase:
#   - a rank that arrives at the store but exits before publishing its Gloo address
#     (NDMESH_TEST_EXIT_BEFORE_GLOO=1 on rank 3; the launcher leaves the others running)
#     ends them with exit 124 and the line naming it, within the timeout (Gloo alone waits
#     30 days);
#   - rank 0, which serves the store, starting 3 s late while rank 3 never starts: the
#     others give up 4 s after their start, not 4 s after they could connect (7 s).
#   init_bound.sh <ndmesh> <launcher command...>
set -uo pipefail
ndmesh=$1
shift
run=("$@")
fail() { echo "FAIL: $*" >&2; exit 1; }
now() { date +%s.%N; }
# expect <needle> <max seconds> <command...>: every rank ends, one says needle, in time.
expect() {
  local needle=$1 limit=$2 start out end started elapsed
  shift 2
  start=$(now)
  out=$(timeout -s KILL 60 "$@" 2>&1)
  [ $? -ne 137 ] || fail "the job hung: $*: $out"
  end=$(now)
  started=$(sed -n 's/^torchrun_env: ranks started at //p' <<< "$out" | head -n 1)
  elapsed=$(awk -v a="${started:-$start}" -v b="$end" 'BEGIN{printf "%.2f", b - a}')
  grep -qF -- "$needle" <<< "$out" || fail "no '$needle' in: $out"
  awk -v e="$elapsed" -v l="$limit" 'BEGIN{exit !(e < l)}' || fail "took ${elapsed} s (limit $limit s): $out"
  echo "ok (${elapsed} s): $(grep -F -- "$needle" <<< "$out" | head -n 1)"
}

NDMESH_INIT_TIMEOUT_S=3 expect \
  "rank 3 of WORLD_SIZE=4 arrived but did not publish its Gloo address within 3 s of the start (NDMESH_INIT_TIMEOUT_S)" \
  5.5 "${run[@]}" --keep-going --set 3:NDMESH_TEST_EXIT_BEFORE_GLOO=1 -np 4 "$ndmesh" check --tp 2 --dp 2
# Every rank that waited said it and exited 124 (the launcher keeps going until all end).
NDMESH_INIT_TIMEOUT_S=4 expect "rank 3 of WORLD_SIZE=4 did not arrive at the store" 6.5 \
  "${run[@]}" --omit-rank 3 -np 4 bash -c '[ "$RANK" != 0 ] || sleep 3; exec "$0" "$@"' "$ndmesh" check --tp 2 --dp 2
echo PASS
