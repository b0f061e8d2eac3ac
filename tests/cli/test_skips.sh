#!/usr/bin/env bash
# scripts/test_skips.py, which ends make test: it lists every skipped test with its reason, and
# fails when a reason names a package that make deps installs (a broken install), not when it
# names something this machine may lack (a GPU, PyPI). Checked on JUnit reports written here in
# ctest's shape.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
report() {  # report <file> <skip reason of a script test> : a passing test, a GPU skip, and that skip
  cat > "$1" << XML
<?xml version="1.0" encoding="UTF-8"?>
<testsuite name="x" tests="3" failures="0" disabled="0" skipped="2" hostname="" time="1" timestamp="">
<testcase name="mesh.Mesh.Parses" classname="mesh.Mesh.Parses" time="0.1" status="run"><system-out>[  PASSED  ] 1 test.</system-out></testcase>
<testcase name="gpu.CudaAdamW.Steps" classname="gpu.CudaAdamW.Steps" time="0.1" status="notrun"><skipped message="SKIP_REGULAR_EXPRESSION_MATCHED"/><system-out>[ RUN      ] CudaAdamW.Steps
tests/gpu/gpu_test.hpp:30: Skipped
no usable CUDA GPU here
[  SKIPPED ] CudaAdamW.Steps</system-out></testcase>
<testcase name="reference.block" classname="reference.block" time="0.1" status="notrun"><skipped message="SKIP_RETURN_CODE=77"/><system-out>$2</system-out></testcase>
</testsuite>
XML
}
report "$tmp/ok.xml" "SKIP: PyPI is unreachable"
python3 "$here/scripts/test_skips.py" "$tmp/ok.xml" "$here/Makefile" > "$tmp/ok.out" || fail "a GPU and a PyPI skip failed the run: $(cat "$tmp/ok.out")"
grep -qF "skipped: 2 tests" "$tmp/ok.out" || fail "the skips are not counted: $(cat "$tmp/ok.out")"
grep -qF "no usable CUDA GPU here  (gpu.CudaAdamW.Steps)" "$tmp/ok.out" || fail "GoogleTest's skip reason not shown: $(cat "$tmp/ok.out")"
grep -qF "SKIP: PyPI is unreachable  (reference.block)" "$tmp/ok.out" || fail "a script's skip reason not shown: $(cat "$tmp/ok.out")"
report "$tmp/bad.xml" "SKIP: no torch for this python3 (apt-get install python3-torch)"
if python3 "$here/scripts/test_skips.py" "$tmp/bad.xml" "$here/Makefile" > "$tmp/bad.out"; then
  fail "a skip for want of python3-torch (a make deps package) passed: $(cat "$tmp/bad.out")"
fi
grep -qF "FAIL: reference.block: skipped for want of python3-torch, which make deps installs" "$tmp/bad.out" ||
  fail "the failing skip is not named: $(cat "$tmp/bad.out")"
echo "test_skips.sh: ok"
