#!/usr/bin/env bash
# The elastic suite's faults for several replica layouts, beyond the few ctest registers
# (CI time): for each layout, a rank SIGKILLed inside the reduction, at the vote and before the
# update (then restarted), a replica stopped with SIGSTOP past the heartbeat timeout, the
# coordinator killed and restarted (tests/elastic/elastic_faults.sh), and a whole node lost
# (tests/multinode/elastic.sh: root and network namespaces, else reported SKIP). Each run
# checks every committed step against the serial run. Prints one line per (layout, fault):
# PASS / FAIL / SKIP and its seconds; the failures' output is kept in a folder it names.
#   scripts/elastic_kill_matrix.sh [ndmesh]   (default build/bin/ndmesh)
#   ELASTIC_MATRIX_LAYOUTS: layouts separated by ';' (default "--tp 2;--dp 2 --zero 3;--pp 2")
#   ELASTIC_MATRIX_FAULTS: faults (default "reduce vote update stop coordinator node")
#   ELASTIC_TEST_LAYERS: the model's blocks (default 2; e.g. 4 for --pp 2 --schedule interleaved --vpp 2)
# On a GPU machine, e.g. ELASTIC_MATRIX_LAYOUTS="--tp 2 --device cuda" (with one GPU for both
# ranks of a replica: NDMESH_BACKEND=mpi, the staged device communicator; NCCL wants a GPU each).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$root/build/bin/ndmesh}
IFS=';' read -r -a layouts <<< "${ELASTIC_MATRIX_LAYOUTS:---tp 2;--dp 2 --zero 3;--pp 2}"
read -r -a faults <<< "${ELASTIC_MATRIX_FAULTS:-reduce vote update stop coordinator node}"
logs=$(mktemp -d /tmp/elastic_matrix.XXXXXX)
failed=0
printf '%-18s %-12s %-6s %s\n' layout fault result seconds
for layout in "${layouts[@]}"; do
  for fault in "${faults[@]}"; do
    name="$(echo "$layout" | tr -d ' -')_$fault"
    start=$(date +%s.%N)
    if [ "$fault" = node ]; then
      bash "$root/tests/multinode/fixture.sh" setup > /dev/null 2>&1
      ELASTIC_NODE_LAYOUT="$layout" ELASTIC_NODE_LAYERS="${ELASTIC_TEST_LAYERS:-2}" bash "$root/tests/multinode/elastic.sh" "$bin" > "$logs/$name.log" 2>&1
      rc=$?
      bash "$root/tests/multinode/fixture.sh" cleanup >> "$logs/$name.log" 2>&1
    else
      ELASTIC_TEST_LAYOUT="$layout" bash "$root/tests/elastic/elastic_faults.sh" "$fault" \
        mpirun --allow-run-as-root --oversubscribe "$bin" > "$logs/$name.log" 2>&1
      rc=$?
    fi
    seconds=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN{printf "%.0f", e - s}')
    case $rc in
      0) result=PASS ;;
      77) result=SKIP ;;
      *) result=FAIL failed=1 ;;
    esac
    printf '%-18s %-12s %-6s %s\n' "$layout" "$fault" "$result" "$seconds"
    [ "$result" = PASS ] && rm -f "$logs/$name.log"
  done
done
if [ "$failed" -ne 0 ]; then
  echo "the failures' output: $logs"
  exit 1
fi
rm -rf "$logs"
