#!/usr/bin/env bash
# make fuzz: runs every fuzz target for SECONDS seconds, one after another, starting from
# the committed seed corpus (fuzz/corpus/<target>, read-only) and keeping what it finds in
# <build>/corpus/<target>. Crashes and hangs (> 10 s per input) are written to
# <build>/artifacts/<target>/ and make the run fail. Prints libFuzzer's final line per target.
set -uo pipefail
build=$1
seconds=${2:-60}
here=$(cd "$(dirname "$0")" && pwd)
status=0
for exe in "$build"/fuzz/fuzz_*; do
  target=$(basename "$exe")
  mkdir -p "$build/corpus/$target" "$build/artifacts/$target"
  log="$build/$target.log"
  echo "== $target: ${seconds} s"
  "$exe" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 -print_final_stats=1 \
    -artifact_prefix="$build/artifacts/$target/" "$build/corpus/$target" "$here/corpus/$target" >"$log" 2>&1
  rc=$?
  grep -E '^#[0-9]+.*(DONE|cov:)' "$log" | tail -1
  grep -E '^stat::number_of_executed_units' "$log"
  if [ $rc -ne 0 ]; then
    echo "$target FAILED (exit $rc); see $log and $build/artifacts/$target/"
    grep -m3 -E 'ERROR|runtime error|terminate|deadly signal' "$log"
    status=1
  fi
done
exit $status
